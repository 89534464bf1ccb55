"""The `tabular` input and model: prepare(), its UserErrors, model_fn modes, training, export."""
import json

import numpy as np
import pytest
import tensorflow as tf

import input_fns.tabular as tabular_input
import model_fns.tabular as tabular_model
from estimator_dist.errors import UserError
from estimator_dist.training.registry import INPUTS, MODELS

TRAIN, EVAL, PREDICT = tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL, tf.estimator.ModeKeys.PREDICT

SMALL_CSV = """\
age,home city,income $,member,label
23,paris,1200.5,True,no
35,london,3400,False,yes
41,paris,2800,True,yes
19,berlin,900,False,no
52,london,5100,True,yes
33,paris,2100,False,no
47,berlin,4300,True,yes
28,london,1500,False,no
61,paris,6100,True,yes
38,berlin,2500,False,no
44,london,3900,True,yes
26,paris,1100,False,no
"""


def write(tmp_path, text, name="data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def base_params(**overrides):
    params = dict(MODELS.get("tabular").hparams, batch_size=16, data_path="", label_column="",
                  data_dir="", synthetic=False, seed=0)
    params.update(overrides)
    return params


def prepared(**overrides):
    params = base_params(**overrides)
    params.update(INPUTS.get("tabular").prepare(params))
    return params


def make_regression_csv(tmp_path, rows=400):
    """y = 40*x1 - 25*x2 + city and store offsets + noise, around 1000: needs the label scaling.

    city has 4 values (one-hot), store 30 (an embedding).
    """
    rng = np.random.RandomState(1)
    offsets = {"north": 30.0, "south": -30.0, "east": 0.0, "west": 10.0}
    stores = {f"store {i}": 2.0 * (i % 5) for i in range(30)}
    lines = ["x1,x2,city,store,y"]
    for _ in range(rows):
        x1, x2 = rng.randn(2)
        city, store = rng.choice(sorted(offsets)), rng.choice(sorted(stores))
        y = 1000 + 40 * x1 - 25 * x2 + offsets[city] + stores[store] + rng.randn()
        lines.append(f"{x1:.4f},{x2:.4f},{city},{store},{y:.3f}")
    return write(tmp_path, "\n".join(lines) + "\n", "regression.csv")


def estimator(params, model_dir):
    config = tf.estimator.RunConfig(tf_random_seed=0, save_summary_steps=10_000,
                                    log_step_count_steps=10_000, save_checkpoints_secs=None,
                                    save_checkpoints_steps=10_000)
    return tf.estimator.Estimator(MODELS.get("tabular").fn, model_dir=str(model_dir), params=params,
                                  config=config)


def input_fn(params, mode):
    return lambda: INPUTS.get("tabular").fn(mode, params)


def test_prepare_small_csv(tmp_path):
    path = write(tmp_path, SMALL_CSV)
    info = INPUTS.get("tabular").prepare(base_params(data_path=path, label_column="label"))

    assert info["columns"] == {"age": "age", "home_city": "home city", "income__": "income $",
                               "member": "member"}
    assert info["numeric_columns"] == ["age", "income__"]
    assert info["categorical_columns"] == ["home_city", "member"]
    assert info["serving_features"] == {"age": [[], "float32"], "home_city": [[], "string"],
                                        "income__": [[], "float32"], "member": [[], "string"]}
    assert info["task"] == "classification"
    assert info["num_classes"] == 2 and info["label_vocabulary"] == ["no", "yes"]
    assert info["train_examples"] + info["eval_examples"] == 12 and info["eval_examples"] == 2
    assert set(info["vocabularies"]["home_city"]) <= {"berlin", "london", "paris"}
    assert info["vocabularies"]["member"] == ["False", "True"]
    assert info["embedding_dims"]["home_city"] == 0  # small vocabulary: one-hot
    # Statistics come from the train split only.
    train, _ = tabular_input.split_indices(12, 0.2)
    ages = np.array([23, 35, 41, 19, 52, 33, 47, 28, 61, 38, 44, 26], float)[train]
    assert info["numeric_mean"]["age"] == pytest.approx(ages.mean())
    assert info["numeric_std"]["age"] == pytest.approx(ages.std())
    # Deterministic and independent of the training seed; survives a JSON round trip.
    again = INPUTS.get("tabular").prepare(base_params(data_path=path, label_column="label", seed=123))
    assert again == info
    assert json.loads(json.dumps(info)) == info


def test_task_inference(tmp_path):
    few_ints = "a,y\n" + "".join(f"{i * 0.5},{i % 3}\n" for i in range(30))
    floats = "a,y\n" + "".join(f"{i * 0.5},{i * 1.5}\n" for i in range(30))
    p_ints = prepared(data_path=write(tmp_path, few_ints, "i.csv"), label_column="y")
    p_floats = prepared(data_path=write(tmp_path, floats, "f.csv"), label_column="y")
    p_forced = prepared(data_path=write(tmp_path, few_ints, "i.csv"), label_column="y", task="regression")
    assert (p_ints["task"], p_ints["label_vocabulary"]) == ("classification", ["0", "1", "2"])
    assert (p_floats["task"], p_floats["num_classes"]) == ("regression", None)
    assert p_forced["task"] == "regression"


def test_sanitize_names_is_unique_and_valid():
    names = tabular_input.sanitize_names(["mean radius", "mean_radius", "1st", "_x", "ok"])
    assert names == {"mean radius": "mean_radius", "mean_radius": "mean_radius_2", "1st": "f_1st",
                     "_x": "f__x", "ok": "ok"}


ROWS = [f"{i},{i % 2},c{i % 3}\n" for i in range(10)]  # row i is on line i + 2
NUMBERS = "".join(ROWS)
BAD_CSVS = [
    # (name, csv text or None for a missing file, params, fragments the message must contain)
    ("missing file", None, {"label_column": "y"}, ["not found", "nope.csv"]),
    ("unknown label", "a,y,c\n" + NUMBERS, {"label_column": "label"},
     ["label column 'label'", "columns: a, y, c"]),
    ("no label given", "a,y,c\n" + NUMBERS, {}, ["label_column is required", "columns: a, y, c"]),
    ("empty file", "", {"label_column": "y"}, ["is empty"]),
    ("header only", "a,y,c\n", {"label_column": "y"}, ["no data rows"]),
    ("long row", "a,y,c\n" + "".join(ROWS[:2]) + "5,1,c2,9\n" + "".join(ROWS[2:]), {"label_column": "y"},
     ["line 4", "4 fields", "header has 3"]),
    ("short row", "a,y,c\n" + NUMBERS + "5,1\n", {"label_column": "y"}, ["line 12", "2 fields"]),
    ("text in numbers", "a,y,c\n" + NUMBERS.replace("7,1,c1", "seven,1,c1"), {"label_column": "y"},
     ["line 9", "column 'a'", "'seven'"]),
    ("missing number", "a,y,c\n" + NUMBERS.replace("3,1,c0", ",1,c0"), {"label_column": "y"},
     ["line 5", "column 'a'", "missing value"]),
    ("label NaN", "a,y,c\n" + NUMBERS.replace("4,0,c1", "4,NaN,c1"), {"label_column": "y"},
     ["line 6", "column 'y'", "missing value"]),
    ("empty text label", "a,y,c\n" + NUMBERS.replace("4,0,c1", "4,0,"), {"label_column": "c"},
     ["line 6", "label column 'c'", "missing label"]),
    ("text label regression", "a,y,c\n" + NUMBERS, {"label_column": "c", "task": "regression"},
     ["task=classification"]),
    ("bad task", "a,y,c\n" + NUMBERS, {"label_column": "y", "task": "clustering"},
     ["task 'clustering'", "auto, classification, regression"]),
    ("bad eval_fraction", "a,y,c\n" + NUMBERS, {"label_column": "y", "eval_fraction": 1.5},
     ["eval_fraction 1.5"]),
]


@pytest.mark.parametrize("name,text,params,fragments", BAD_CSVS, ids=[c[0] for c in BAD_CSVS])
def test_prepare_user_errors(tmp_path, name, text, params, fragments):
    path = str(tmp_path / "nope.csv") if text is None else write(tmp_path, text)
    with pytest.raises(UserError) as error:
        INPUTS.get("tabular").prepare(base_params(data_path=path, **params))
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("value", ["64,x", "", "0", "-3,2", "1.5"])
def test_bad_hidden_units(value):
    with pytest.raises(UserError, match="hidden_units"):
        tabular_model.parse_hidden_units(value)
    assert tabular_model.parse_hidden_units("128, 64") == [128, 64]


def test_input_fn_matches_serving_features_and_shards(tmp_path):
    params = prepared(data_path=write(tmp_path, SMALL_CSV), label_column="label", batch_size=4)
    features, labels = next(iter(INPUTS.get("tabular").fn(TRAIN, params)))
    assert {k: v.dtype.name for k, v in features.items()} == {
        name: dtype for name, (_, dtype) in params["serving_features"].items()}
    assert labels.dtype == tf.int32 and labels.shape == [4]
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    shard = INPUTS.get("tabular").fn(EVAL, dict(params, batch_size=100), context)
    whole = INPUTS.get("tabular").fn(EVAL, dict(params, batch_size=100))
    assert len(next(iter(shard))[1]) == 1 and len(next(iter(whole))[1]) == params["eval_examples"]


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_model_fn_modes(tmp_path, task):
    params = prepared(data_path=make_regression_csv(tmp_path, rows=60), label_column="city"
                      if task == "classification" else "y")
    features, labels = tabular_input.load_split(params, EVAL)
    batch = len(labels)
    model_fn = MODELS.get("tabular").fn
    with tf.Graph().as_default():
        predict = model_fn({k: tf.constant(v) for k, v in features.items()}, None, PREDICT, params)
        with tf.compat.v1.variable_scope("", reuse=tf.compat.v1.AUTO_REUSE):
            train = model_fn({k: tf.constant(v) for k, v in features.items()}, tf.constant(labels),
                             TRAIN, params)
            evaluate = model_fn({k: tf.constant(v) for k, v in features.items()}, tf.constant(labels),
                                EVAL, params)
        assert train.train_op is not None and train.loss.shape == []
        assert "serving_default" in predict.export_outputs
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = sess.run(predict.predictions)
        if task == "classification":
            assert set(evaluate.eval_metric_ops) == {"accuracy"}
            assert out["class_ids"].dtype == np.int64 and out["class_ids"].shape == (batch,)
            assert out["probabilities"].shape == (batch, 4)
            np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
        else:
            assert set(evaluate.eval_metric_ops) == {"rmse", "mae"}
            assert out["predictions"].dtype == np.float32 and out["predictions"].shape == (batch,)


def test_model_fn_refuses_unprepared_params():
    with tf.Graph().as_default(), pytest.raises(UserError, match="prepare"):
        MODELS.get("tabular").fn({"a": tf.constant([1.0])}, None, PREDICT, base_params())


@pytest.fixture(scope="module")
def breast_cancer(tmp_path_factory):
    params = prepared(batch_size=64)
    est = estimator(params, tmp_path_factory.mktemp("breast_cancer"))
    est.train(input_fn(params, TRAIN), max_steps=200)
    return est, params


def test_breast_cancer_accuracy(breast_cancer):
    est, params = breast_cancer
    assert params["task"] == "classification" and params["eval_examples"] == 114
    metrics = est.evaluate(input_fn(params, EVAL))
    assert metrics["global_step"] == 200
    assert metrics["accuracy"] >= 0.95, metrics


def serving_receiver(serving_features):
    with tf.Graph().as_default():
        placeholders = {
            name: tf.compat.v1.placeholder(tf.as_dtype(dtype), [None] + shape, name=name)
            for name, (shape, dtype) in serving_features.items()}
    return tf.estimator.export.build_raw_serving_input_receiver_fn(placeholders)


def export_and_load(est, params, export_dir):
    path = est.export_saved_model(str(export_dir), serving_receiver(params["serving_features"]))
    return tf.saved_model.load(path.decode() if isinstance(path, bytes) else path).signatures[
        "serving_default"]


def test_breast_cancer_export_matches_predict(breast_cancer, tmp_path):
    est, params = breast_cancer
    serve = export_and_load(est, params, tmp_path)
    features, _ = tabular_input.load_split(params, PREDICT)
    served = serve(**{k: tf.constant(v) for k, v in features.items()})
    predicted = list(est.predict(input_fn(params, PREDICT)))
    np.testing.assert_allclose(served["probabilities"].numpy(),
                               np.stack([p["probabilities"] for p in predicted]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(served["class_ids"].numpy(), [p["class_ids"] for p in predicted])


def test_regression_trains_and_serves_raw_values(tmp_path):
    params = prepared(data_path=make_regression_csv(tmp_path), label_column="y", batch_size=64)
    assert params["task"] == "regression" and params["categorical_columns"] == ["city", "store"]
    assert params["embedding_dims"] == {"city": 0, "store": 6}
    est = estimator(params, tmp_path / "model")
    est.train(input_fn(params, TRAIN), max_steps=1)
    start = est.evaluate(input_fn(params, EVAL))["loss"]
    est.train(input_fn(params, TRAIN), max_steps=300)
    end = est.evaluate(input_fn(params, EVAL))["loss"]
    assert end < 0.01 * start, (start, end)

    serve = export_and_load(est, params, tmp_path / "export")
    features, _ = tabular_input.load_split(params, PREDICT)
    served = serve(**{k: tf.constant(v) for k, v in features.items()})["predictions"].numpy()
    predicted = np.array([p["predictions"] for p in est.predict(input_fn(params, PREDICT))])
    np.testing.assert_allclose(served, predicted, rtol=1e-5)
    # Unseen cities share the OOV bucket instead of failing.
    unseen = {"x1": tf.constant([0.5, 0.5]), "x2": tf.constant([-1.0, -1.0]),
              "city": tf.constant(["atlantis", "nowhere"]), "store": tf.constant(["store 99", ""])}
    out = serve(**unseen)["predictions"].numpy()
    assert np.all(np.isfinite(out)) and out[0] == out[1]
