"""A small CNN for the 8x8 digits, built from tf.keras layers inside a model_fn."""
import tensorflow as tf

from estimator_dist.graph import hparam_checks
from estimator_dist.serving.heads import classification_spec
from estimator_dist.training.registry import register_model


def build_network(filters: int, dense_units: int, dropout: float, num_classes: int):
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Conv2D(filters, 3, padding="same", use_bias=False, name="conv1"),
        layers.BatchNormalization(name="bn1"),
        layers.ReLU(),
        layers.Conv2D(filters * 2, 3, padding="same", use_bias=False, name="conv2"),
        layers.BatchNormalization(name="bn2"),
        layers.ReLU(),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(dense_units, activation="relu", name="fc"),
        layers.Dropout(dropout),
        layers.Dense(num_classes, name="logits"),
    ], name="digits_cnn")


@register_model(
    "digits",
    hparams={"filters": 32, "dense_units": 128, "dropout": 0.2, "optimizer": "momentum",
             "learning_rate": 0.05, "momentum": 0.9, "lr_schedule": "cosine",
             "weight_decay": 0.0},
    default_input="digits",
    run_defaults={"batch_size": 64, "train_steps": 1500},
)
def digits_model(features, labels, mode, params):
    """Conv-BN-ReLU x2, max-pool, dense, softmax over 10 digits."""
    net = build_network(hparam_checks.positive_int(params, "filters", 32),
                        hparam_checks.positive_int(params, "dense_units", 128),
                        hparam_checks.fraction(params, "dropout", 0.2),
                        int(params.get("num_classes", 10)))
    hparam_checks.non_negative_number(params, "weight_decay", 0.0001, default=0.0)
    training = mode == tf.estimator.ModeKeys.TRAIN
    logits = net(tf.cast(features["image"], tf.float32), training=training)
    # Keras layers leave UPDATE_OPS empty inside a model_fn: their batch-norm
    # moving statistics only update if net.updates join the train op.
    update_ops = net.updates if training else None
    return classification_spec(logits, labels, mode, params, update_ops=update_ops)
