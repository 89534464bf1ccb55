"""A bench case's process: read its spec, run its driver (cases.py; comm.py's all-reduce
drivers imported only when run), report the steps through the bench's pipes."""
import json
import sys

from estimator_dist.bench import cases


def runner_for(driver: str, imagenet: bool = False):
    """The function that runs a driver's case (bench_comm's and the ImageNet bench's are
    imported only when run; the latter registers its models and input)."""
    if imagenet:
        from estimator_dist.bench import imagenet_cases

        return imagenet_cases.DRIVERS.get(driver, cases.run_project)
    if driver in ("comm", "tcp"):
        from estimator_dist.bench import comm as bench_comm

        return cases.run_project if driver == "comm" else bench_comm.run_ring
    return {"project": cases.run_project, "plain": cases.run_plain, "keras": cases.run_keras}[driver]


def main(argv=None) -> int:
    """Run the case whose JSON spec file is argv[0]."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    clock = cases.Clock(spec, cases.Gate(spec["control_fds"]))
    code = runner_for(spec["driver"], bool(spec.get("imagenet")))(spec, clock)
    print(f"bench case: training ended after {clock.count} steps, before the bench's quit",
          file=sys.stderr)
    return code or 1
