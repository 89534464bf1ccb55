"""The export of a canned Estimator registered by its model_fn (`est.model_fn`).

A canned head's export outputs (`serving_default` and `classification` or `regression`:
ClassificationOutput/RegressionOutput; `predict`) need one serialized tf.Example input:
over this project's raw-feature receiver TensorFlow dropped all but `predict` ("Export
includes no default signature!"), and `predict` refused the SavedModel. Here they take
the receiver's serialized tf.Examples (export.serving_input_fn parses them with the
serving features), as the canned Estimator's own export with a parsing receiver has them,
and PREDICT_RAW takes the raw feature tensors, for `predict` and for callers without
tf.Example.
"""
import tensorflow as tf

from estimator_dist.serving import heads
from estimator_dist.graph import model_fn_wrap

PREDICT_RAW = "predict_raw"


class ExamplePredictOutput(heads.ExamplesInput, tf.estimator.export.PredictOutput):
    """PredictOutput over serialized tf.Examples (input `examples`, as a canned export's)."""

    INPUT_KEY = "examples"


def _is_canned_output(output) -> bool:
    """A head's own classification/regression output (not one over tf.Examples already)."""
    return isinstance(output, (tf.estimator.export.ClassificationOutput,
                               tf.estimator.export.RegressionOutput)) and \
        not isinstance(output, heads.ExamplesInput)


def _over_examples(output):
    if isinstance(output, tf.estimator.export.ClassificationOutput):
        return heads.ExampleClassificationOutput(scores=output.scores, classes=output.classes)
    if isinstance(output, tf.estimator.export.RegressionOutput):
        return heads.ExampleRegressionOutput(value=output.value)
    return ExamplePredictOutput(output.outputs)


def example_signatures(spec: tf.estimator.EstimatorSpec) -> tf.estimator.EstimatorSpec:
    """A PREDICT spec whose export outputs came from a canned head, with every signature over
    serialized tf.Examples plus PREDICT_RAW over the raw features; other specs unchanged."""
    outputs = spec.export_outputs or {}
    if not any(_is_canned_output(o) for o in outputs.values()):
        return spec
    changed = {key: _over_examples(o) if _is_canned_output(o) or
               type(o) is tf.estimator.export.PredictOutput else o
               for key, o in outputs.items()}
    raw = next((o.outputs for o in outputs.values()
                if type(o) is tf.estimator.export.PredictOutput), None)
    changed[PREDICT_RAW] = tf.estimator.export.PredictOutput(
        raw if raw is not None else spec.predictions)
    return spec._replace(export_outputs=changed)


def with_example_signatures(model_fn):
    """model_fn whose PREDICT spec goes through example_signatures."""
    def call(mode, build):
        spec = build()
        if mode == tf.estimator.ModeKeys.PREDICT and isinstance(spec, tf.estimator.EstimatorSpec):
            return example_signatures(spec)
        return spec

    return model_fn_wrap.around(model_fn, call)
