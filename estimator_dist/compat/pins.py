"""What the door (internals.py) relies on in TensorFlow, as data the canaries check
(tests/test_tf_compat.py): private names by owner, private callables' signatures, and the
digests of TensorFlow methods whose source internals.py copies."""

# The private names used below, by owner: checked on classes and modules by the canaries.
NAMES = {
    "tensorflow.python.distribute.collective_all_reduce_strategy.CollectiveAllReduceExtended":
        ("_enable_check_health",),
    "tensorflow.python.client.pywrap_tf_session": ("TF_SetTfXlaCpuGlobalJit",),
    "tensorflow.python.util._pywrap_util_port": ("IsMklEnabled",),
    "tensorflow.python.training.sync_replicas_optimizer": ("_SyncReplicasOptimizerHook",),
    "tensorflow.python.util.deprecation": ("_PRINT_DEPRECATION_WARNINGS",),
    "tensorflow.python.training.training_util": ("_get_or_create_global_step_read",),
    "tensorflow.python.framework.ops": ("get_gradient_function",),
    "tensorflow.python.distribute.values": ("PerReplica", "Mirrored", "DistributedVariable"),
    "tensorflow.python.distribute.ps_values": ("AggregatingVariable",),
    "tensorflow.python.training.optimizer.Optimizer": ("_distributed_apply",),
    "tensorflow.python.training.basic_session_run_hooks.CheckpointSaverHook":
        ("_set_steps_per_run", "_get_saver", "_save"),
    "tensorflow_estimator.python.estimator.training":
        ("_ContinuousEvalListener", "_EvalStatus", "_TrainingExecutor"),
    "tensorflow_estimator.python.estimator.early_stopping":
        ("_MultiWorkerEarlyStoppingHook", "_StopOnPredicateHook", "_CheckForStoppingHook",
         "read_eval_metrics"),
}

# Private callables called here: their signatures as inspect prints them on TF 2.15.
SIGNATURES = {
    "tensorflow_estimator.python.estimator.training._TrainingExecutor":
        "(estimator, train_spec, eval_spec, train_hooks=None, continuous_eval_listener=None)",
    "tensorflow_estimator.python.estimator.early_stopping._MultiWorkerEarlyStoppingHook":
        "(should_stop_fn, run_every_steps=None)",
    "tensorflow_estimator.python.estimator.early_stopping._StopOnPredicateHook":
        "(should_stop_fn, run_every_secs=60, run_every_steps=None)",
    "tensorflow_estimator.python.estimator.early_stopping._CheckForStoppingHook": "()",
    "tensorflow_estimator.python.estimator.early_stopping.read_eval_metrics": "(eval_dir)",
    "tensorflow.python.training.optimizer.Optimizer._distributed_apply":
        "(self, distribution, grads_and_vars, global_step=None, name=None)",
    "tensorflow.python.training.basic_session_run_hooks.CheckpointSaverHook._set_steps_per_run":
        "(self, steps_per_run)",
    "tensorflow.python.training.basic_session_run_hooks.CheckpointSaverHook._save":
        "(self, session, step)",
    "tensorflow.python.distribute.distribute_utils.regroup":
        "(values, wrap_class=<class 'tensorflow.python.distribute.values.PerReplica'>, "
        "always_wrap=False)",
    "tensorflow.python.framework.ops.get_gradient_function": "(op)",
    "tensorflow.python.framework.meta_graph.create_meta_graph_def":
        "(meta_info_def=None, graph_def=None, saver_def=None, collection_list=None, "
        "graph=None, export_scope=None, exclude_nodes=None, clear_extraneous_savers=False, "
        "strip_default_attrs=False)",
    "tensorflow.python.lib.io.file_io.atomic_write_string_to_file":
        "(filename, contents, overwrite=True)",
    "tensorflow.python.eager.context.Context.configure_coordination_service":
        "(self, service_type, service_leader='', "
        "enable_health_check=True, cluster_register_timeout_in_ms=0, "
        "heartbeat_timeout_in_ms=0, shutdown_barrier_timeout_in_ms=0, "
        "coordinated_jobs=None, allow_new_incarnation_to_reconnect=False)",
    "tensorflow.python.distribute.distribute_lib.StrategyExtendedV2.batch_reduce_to":
        "(self, reduce_op, value_destination_pairs, options=None)",
}

# TensorFlow methods whose source is copied here (sha256 of inspect.getsource on TF 2.15):
# a changed digest means the copy must be compared with TensorFlow's new version.
MIRRORED = {
    "tensorflow.python.training.basic_session_run_hooks.CheckpointSaverHook."
    "after_create_session": "8403ea18570b84c02ec1d2e00590f5e6162323ae771c2155faa0402cc6f28219",
}
