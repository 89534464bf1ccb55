"""Process supervision for `cluster` (TF_CONFIG and Horovod backends), per-task GPUs, TFJob
manifests. Imports no TensorFlow."""
