"""A training batch must fit in the examples its input pipeline reads (the built-in inputs)."""
from estimator_dist.errors import UserError
from estimator_dist.guards.memory import batch_flag


def pipeline_share(examples: int, input_context=None) -> int:
    """How many of `examples` one pipeline reads, sharded as Dataset.shard does it
    (example i goes to pipeline i % num_input_pipelines)."""
    if input_context is None or input_context.num_input_pipelines <= 1:
        return examples
    return len(range(input_context.input_pipeline_id, examples,
                     input_context.num_input_pipelines))


def check_training_batch(input_name: str, params, examples: int, input_context=None):
    """Refuse a training batch larger than this pipeline's share of `examples`.

    A repeated dataset batched past its length fills each batch from many epochs:
    `--batch_size 100000000` on the 1,438 digits never produced its first batch.
    params["batch_size"] is the batch of one input_fn call (per replica,
    docs/strategies.md, "Batch rule"), params["global_batch_size"] the
    --batch_size it came from. Only the training batch: evaluation keeps its last,
    smaller batch. An empty share is left to the input: it yields no batch, which
    the runner reports.

    Raises:
      UserError: naming --batch_size, this pipeline's share and the largest batch allowed.
    """
    if params.get("batch_size") is None:
        return
    batch = int(params["batch_size"])
    share = pipeline_share(examples, input_context)
    if share == 0 or batch <= share:
        return
    data = f"the {share:,} training examples of input '{input_name}'"
    if input_context is not None and input_context.num_input_pipelines > 1:
        data += (f" (this pipeline's share: 1 in {input_context.num_input_pipelines} of "
                 f"{examples:,})")
    given, replicas = batch_flag(params)
    raise UserError(f"--batch_size {given}: larger than {data}; use at most {share * replicas}")
