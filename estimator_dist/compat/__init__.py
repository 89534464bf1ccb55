"""TensorFlow's internals behind one door: internals.py is the only module of the package
that imports TensorFlow's or Estimator's private modules or reads a private TensorFlow
name (tests/test_layout.py refuses them anywhere else; tests/test_tf_compat.py pins them).

Imported as `from estimator_dist.compat import internals`; this package itself imports no
TensorFlow, so importing it costs nothing until a function is used.
"""
