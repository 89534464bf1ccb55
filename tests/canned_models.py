"""Canned Estimators and TF1 model code as TensorFlow's official examples write them, for the
tests of test_canned.py (`--import canned_models` with tests/ on PYTHONPATH).

- census: the official wide & deep census input (TextLineDataset + decode_csv over the UCI
  adult columns, header-less), and canned LinearClassifier, DNNClassifier,
  DNNLinearCombinedClassifier and a LinearRegressor over numeric, bucketized, vocabulary,
  hashed, crossed and embedding feature columns, each registered by its `model_fn`.
- mnist_r1: the official r1 MNIST model_fn (Keras layers in a model_fn, its own Adam
  train_op); `eval_bug=True` keeps the TF1 loss name of its EVAL branch that TensorFlow 2
  moved (tf.losses is Keras there).
"""
import numpy as np
import tensorflow as tf

import estimator_dist as ed

CSV_COLUMNS = ["age", "workclass", "education", "education_num", "occupation",
               "hours_per_week", "income_bracket"]
CSV_DEFAULTS = [[0], [""], [""], [0], [""], [0], [""]]
WORKCLASS = ["Private", "Self-emp-not-inc", "Federal-gov", "State-gov"]
EDUCATION = ["Bachelors", "HS-grad", "Masters", "Some-college"]
OCCUPATION = ["Tech-support", "Sales", "Exec-managerial", "Craft-repair"]


def census_rows(n, seed=0, sep=","):
    """n census-like CSV lines (no header, as adult.data): the label follows age, education
    and hours, so a model can learn it."""
    rng = np.random.RandomState(seed)
    lines = []
    for _ in range(n):
        age = int(rng.randint(18, 70))
        education = EDUCATION[rng.randint(len(EDUCATION))]
        hours = int(rng.randint(10, 70))
        rich = (age > 35) + (education in ("Bachelors", "Masters")) + (hours > 45) >= 2
        cells = [age, WORKCLASS[rng.randint(len(WORKCLASS))], education,
                 EDUCATION.index(education) + 9, OCCUPATION[rng.randint(len(OCCUPATION))],
                 hours, ">50K" if rich else "<=50K"]
        lines.append(sep.join(map(str, cells)))
    return "\n".join(lines) + "\n"


def census_columns():
    """The official example's wide and deep columns (build_model_columns), made smaller."""
    age = tf.feature_column.numeric_column("age")
    education_num = tf.feature_column.numeric_column("education_num")
    hours = tf.feature_column.numeric_column("hours_per_week")
    education = tf.feature_column.categorical_column_with_vocabulary_list("education", EDUCATION)
    workclass = tf.feature_column.categorical_column_with_vocabulary_list("workclass", WORKCLASS)
    occupation = tf.feature_column.categorical_column_with_hash_bucket("occupation", 20)
    age_buckets = tf.feature_column.bucketized_column(age, boundaries=[25, 35, 45, 55])
    base = [education, workclass, occupation, age_buckets]
    crossed = [tf.feature_column.crossed_column(["education", "occupation"], 16),
               tf.feature_column.crossed_column([age_buckets, "education", "occupation"], 16)]
    wide = base + crossed
    deep = [age, education_num, hours, tf.feature_column.indicator_column(workclass),
            tf.feature_column.indicator_column(education),
            tf.feature_column.embedding_column(occupation, dimension=4)]
    return wide, deep


def parse_csv(value):
    """The official census parse_csv: one line -> (features, income above 50K)."""
    columns = tf.io.decode_csv(value, record_defaults=CSV_DEFAULTS)
    features = dict(zip(CSV_COLUMNS, columns))
    labels = features.pop("income_bracket")
    return features, tf.equal(labels, ">50K")


def census_input(mode, params):
    """The official census input_fn: header-less CSV lines through decode_csv."""
    dataset = tf.data.TextLineDataset(params["data_path"])
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(64, seed=1)
    dataset = dataset.repeat().map(parse_csv)
    return dataset.batch(params["batch_size"])


def census_regression_input(mode, params):
    """The census rows with hours_per_week as the label to regress."""
    def parse_csv(value):
        columns = tf.io.decode_csv(value, record_defaults=CSV_DEFAULTS)
        features = dict(zip(CSV_COLUMNS, columns))
        features.pop("income_bracket")
        return features, tf.cast(features.pop("hours_per_week"), tf.float32)

    dataset = tf.data.TextLineDataset(params["data_path"]).repeat().map(parse_csv)
    return dataset.batch(params["batch_size"])


def census_sharded_input(mode, params, input_context=None):
    """The census input as docs/cluster.md asks a multi-worker input to read: its own shard
    of the lines (every n-th), in order (no shuffle: a step's examples are those of one
    process's step over the global batch)."""
    dataset = tf.data.TextLineDataset(params["data_path"])
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    return dataset.repeat().map(parse_csv).batch(params["batch_size"])


ed.register_input("census", data_flags=("data_path",))(census_input)
ed.register_input("census_sharded", data_flags=("data_path",))(census_sharded_input)
ed.register_input("census_hours", data_flags=("data_path",))(census_regression_input)

_wide, _deep = census_columns()
_config = tf.estimator.RunConfig(tf_random_seed=1)
CANNED = {
    "census_linear": tf.estimator.LinearClassifier(_wide, config=_config),
    "census_dnn": tf.estimator.DNNClassifier([8, 4], _deep, config=_config),
    "census_wide_deep": tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=_wide, dnn_feature_columns=_deep, dnn_hidden_units=[8, 4],
        config=_config),
}
for _name, _estimator in CANNED.items():
    ed.register_model(_name, default_input="census")(_estimator.model_fn)
ed.register_model("census_hours_linear", default_input="census_hours")(
    tf.estimator.LinearRegressor(_wide, config=_config).model_fn)


def mnist_r1_model(features, labels, mode, params):
    """The official r1 MNIST model_fn (create_model's Keras layers, its own Adam train_op)."""
    image = features["image"] if isinstance(features, dict) else features
    model = tf.keras.Sequential([
        tf.keras.layers.Reshape([28, 28, 1]),
        tf.keras.layers.Conv2D(4, 5, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(4, 4),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    if mode == tf.estimator.ModeKeys.PREDICT:
        logits = model(image, training=False)
        predictions = {"classes": tf.argmax(logits, axis=1),
                       "probabilities": tf.nn.softmax(logits)}
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=1e-3)
        logits = model(image, training=True)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
        return tf.estimator.EstimatorSpec(
            mode, loss=loss,
            train_op=optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step()))
    logits = model(image, training=False)
    losses = tf.losses if params.get("eval_bug") else tf.compat.v1.losses
    loss = losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))})


ed.register_model("mnist_r1", hparams={"eval_bug": False}, default_input="mnist_like")(
    mnist_r1_model)


@ed.register_input("mnist_like")
def mnist_like_input(mode, params):
    """MNIST-shaped images ([28, 28] floats, as the official dataset.py yields them)."""
    rng = np.random.RandomState(0)
    images = rng.rand(64, 28, 28).astype(np.float32)
    labels = (images[:, :14].mean(axis=(1, 2)) > 0.5).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
    return dataset.repeat().batch(params["batch_size"])


def mnist_flat_input(mode, params):
    """MNIST as the official r1 dataset.py yields it: (image [784], label), one tensor."""
    rng = np.random.RandomState(0)
    images = rng.rand(64, 784).astype(np.float32)
    labels = (images[:, :392].mean(axis=1) > 0.5).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(
        params["batch_size"])


def mnist_receiver():
    """The official r1 MNIST export's receiver: image [None, 28, 28]."""
    image = tf.compat.v1.placeholder(tf.float32, [None, 28, 28], name="image")
    return tf.estimator.export.ServingInputReceiver({"image": image}, {"image": image})


ed.register_input("mnist_flat")(mnist_flat_input)
ed.register_input("mnist_flat_served", serving_input=mnist_receiver)(mnist_flat_input)
ed.register_model("mnist_r1_served", hparams={"eval_bug": False}, default_input="mnist_flat",
                  serving_input={"image": [[28, 28], "float32"]})(mnist_r1_model)


@ed.register_input("word_ids")
def word_ids_input(mode, params, input_context=None):
    """Bags of 3 word ids out of 50, labelled by a rule on them: a TF1 sparse-feature input
    (from_tensor_slices, repeat in every mode), sharded per input pipeline as docs ask."""
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 50, size=(96, 3)).astype(np.int64)
    labels = (ids.min(axis=1) < 10).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels))
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    return dataset.repeat().batch(params["batch_size"])


@ed.register_model("embedding_momentum", default_input="word_ids")
def embedding_momentum_model(features, labels, mode, params):
    """A TF1 model_fn over an embedding table looked up by each batch's distinct ids (a
    gradient of as many rows as the batch touches: IndexedSlices of varying length), with
    its own MomentumOptimizer train_op: a dense update would move untouched rows too."""
    table = tf.compat.v1.get_variable(
        "embeddings", [50, 4], initializer=tf.compat.v1.random_normal_initializer(seed=1))
    ids = tf.reshape(features["ids"], [-1])
    distinct, position = tf.unique(ids)
    rows = tf.gather(tf.gather(table, distinct), position)
    bag = tf.reduce_sum(tf.reshape(rows, [-1, 3, 4]), axis=1)
    logits = tf.compat.v1.layers.dense(
        bag, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.5), name="logits")[:, 0]
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.5, momentum=0.9)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()))
