"""`bench --models imagenet` (issue 26 part 5): the r1 reference pipeline is r1's recipe, the
project's images stay within 2/255 of r1's for the same crop box, the parts and targets, and
a quick run that prints targets a)-c) with met/missed."""
import glob
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.bench import cases as bench_cases
from estimator_dist.bench import imagenet_data
from estimator_dist.bench import imagenet_reference as reference
from estimator_dist.bench import plan as bench_plan
from estimator_dist.bench import results as bench_results
from estimator_dist.errors import UserError
from input_fns import imagenet_preprocessing as preprocessing
from support import run_cli

MAX_MAE = 2.0  # of 255: the issue's 2/255 on pixels 0-255


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """Six of the bench's JPEGs (two of each class), as bytes."""
    root = str(tmp_path_factory.mktemp("bench_images"))
    imagenet_data.write_images(root, 6)
    return [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(root, "*", "*.jpg")))]


def test_bench_images_have_imagenets_sizes(jpegs):
    shapes = [tuple(tf.image.extract_jpeg_shape(j).numpy()[:2]) for j in jpegs]
    assert set(shapes) <= set(imagenet_data.SIZES)
    assert np.mean([len(j) for j in jpegs]) > 60_000  # ImageNet's average is about 110 KB


def _graph_ops(build):
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.get_operations()


def test_reference_is_r1s_recipe():
    """r1's numbers, and the ops of its parse_record in r1's order, with r1's attributes."""
    assert reference.CHANNEL_MEANS == [123.68, 116.78, 103.94]
    assert (reference.MIN_OBJECT_COVERED, reference.ASPECT_RATIO_RANGE, reference.AREA_RANGE,
            reference.MAX_ATTEMPTS) == (0.1, [0.75, 1.33], [0.05, 1.0], 100)
    assert (reference.SHUFFLE_BUFFER, reference.CYCLE_LENGTH) == (10000, 10)
    ops = _graph_ops(lambda: reference.parse_record(tf.constant(b""), 224))
    types = [op.type for op in ops]
    box = next(op for op in ops if op.type.startswith("SampleDistortedBoundingBox"))
    assert math.isclose(box.inputs[2].op.get_attr("value").float_val[0], 0.1, rel_tol=1e-6)
    assert [round(v, 4) for v in box.get_attr("aspect_ratio_range")] == [0.75, 1.33]
    assert [round(v, 4) for v in box.get_attr("area_range")] == [0.05, 1.0]
    assert box.get_attr("max_attempts") == 100
    assert box.get_attr("use_image_if_no_bounding_boxes")
    assert box.inputs[0].op.type == "ExtractJpegShape"
    resize = next(op for op in ops if op.type == "ResizeBilinear")
    assert not resize.get_attr("align_corners") and not resize.get_attr("half_pixel_centers")
    flip = next(i for i, t in enumerate(types) if t in ("If", "StatelessIf", "ReverseV2"))
    order = [types.index("DecodeAndCropJpeg"), flip, types.index("ResizeBilinear"),
             types.index("BroadcastTo")]
    assert order == sorted(order)  # decode-and-crop, flip (random cond), resize, mean subtraction
    assert resize.inputs[0].dtype == tf.uint8  # the resize reads the uint8 crop
    dataset = reference.input_fn(["a", "b"], 32, 224)
    assert dataset.options().threading.max_intra_op_parallelism == 1


# Crop boxes as fractions of the image (top, left, height, width): whole, small, corners.
BOXES = [(0.0, 0.0, 1.0, 1.0), (0.1, 0.2, 0.25, 0.3), (0.3, 0.0, 0.7, 0.6),
         (0.0, 0.4, 0.9, 0.6), (0.45, 0.45, 0.5, 0.5)]


def _windows(jpeg):
    height, width = tf.image.extract_jpeg_shape(jpeg).numpy()[:2]
    for top, left, h, w in BOXES:
        yield tf.constant([int(top * height), int(left * width), max(1, int(h * height)),
                           max(1, int(w * width))])


def _mae(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).mean())


@pytest.mark.parametrize("size", [224, 64])
def test_project_image_is_within_2_of_255_of_r1s_for_the_same_crop_box(jpegs, size):
    """Every crop box, flipped or not: the project's pixels (before its per-batch normalize)
    against r1's (before its mean subtraction); then the project's normalize against
    (pixels - mean) / std, the model's first op."""
    worst = 0.0
    for jpeg in jpegs:
        for window in _windows(jpeg):
            for flip in (False, True):
                flip = tf.constant(flip)
                r1 = reference.preprocess_window(jpeg, window, flip, size) + \
                    np.array(reference.CHANNEL_MEANS, np.float32)
                mine = preprocessing.crop_flip_resize(jpeg, window, flip, size)
                assert mine.shape == (size, size, 3) and mine.dtype == tf.float32
                worst = max(worst, _mae(mine, r1))
    assert worst <= MAX_MAE, f"MAE {worst:.3f} of 255 at {size} px"
    batch = tf.stack([mine, mine])
    expected = (batch.numpy() - np.array(preprocessing.MEAN_RGB)) / np.array(preprocessing.STDDEV_RGB)
    normalized = preprocessing.normalize(batch)
    assert normalized.shape == batch.shape
    np.testing.assert_allclose(normalized.numpy(), expected, atol=1e-5)


def test_the_check_can_fail_a_flip_after_the_resize_is_not_within_it(jpegs):
    """The legacy bilinear resize samples from the left edge, so flipping after it moves the
    samples: the shortcut the project does not take, caught by the same measure."""
    worst = 0.0
    for jpeg in jpegs:
        for window in _windows(jpeg):
            r1 = reference.preprocess_window(jpeg, window, tf.constant(True), 224)
            after = tf.reverse(reference.preprocess_window(jpeg, window, tf.constant(False), 224),
                               [1])
            worst = max(worst, _mae(after, r1))
    assert worst > MAX_MAE


def test_the_pixels_only_floor_makes_r1s_pixels_less_the_mean(jpegs):
    """The floor the bench measures does r1's pixel work and nothing else: the same values as
    r1's unflipped image before its mean subtraction."""
    for jpeg in jpegs:
        for window in _windows(jpeg):
            r1 = reference.preprocess_window(jpeg, window, tf.constant(False), 64)
            floor = reference.pixels(jpeg, window, 64)
            np.testing.assert_allclose(floor.numpy() - np.array(reference.CHANNEL_MEANS),
                                       r1.numpy(), atol=1e-4)


def test_imagenet_input_runs_each_op_on_one_thread(tmp_path):
    """r1's max_intra_op_parallelism = 1, for training and eval."""
    from estimator_dist.training.registry import INPUTS

    records = imagenet_data.write_records(str(tmp_path), 6)
    params = {"data_dir": records, "batch_size": 2, "image_size": 32}
    for mode in (tf.estimator.ModeKeys.TRAIN, tf.estimator.ModeKeys.EVAL):
        dataset = INPUTS.get("imagenet").fn(mode, params)
        assert dataset.options().threading.max_intra_op_parallelism == 1


def test_imagenet_is_opt_in_and_stands_for_its_three_parts():
    assert "imagenet" not in bench_plan.MODELS and bench_plan.Options().models == bench_plan.MODELS
    assert bench_plan.expand_models(("mlp", "imagenet", "resnet50")) == \
        ("mlp", "imagenet_input", "resnet50", "imagenet_overhead")
    with pytest.raises(UserError, match="--models imagenett: choose from cifar, mlp, imagenet "
                                        r"\(imagenet: its parts imagenet_input, resnet50, "
                                        r"imagenet_overhead, which may be given alone\)"):
        bench_plan.check_options(bench_plan.Options(models=("imagenett",)))


def test_targets_a_to_c_have_the_issues_goals():
    goals = {}
    for model in bench_plan.IMAGENET_PARTS:
        names = {c.name: c for c in bench_plan.cases_for(model)}
        for label, num, den, kind, goal in bench_plan.TARGETS:
            if num in names and den in names:
                assert names[num].group == names[den].group  # measured interleaved
                goals[(model, label)] = (kind, goal)
    assert goals == {
        ("imagenet_input", "input alone, per CPU-second: project / r1, 224 px"): ("cpu", 1.3),
        ("imagenet_input", "input alone, per CPU-second: project / r1, 64 px"): ("cpu", 1.3),
        ("imagenet_input", "input alone, per CPU-second: r1 pixels-only / r1, 224 px"):
            ("cpu", None),
        ("imagenet_input", "input alone, per CPU-second: r1 pixels-only / r1, 64 px"):
            ("cpu", None),
        ("resnet50", "project none / Keras fit, N=1"): ("min", 1.0),
        ("resnet50", "project mirrored / Keras fit mirrored, N=2"): ("min", 1.0),
        ("resnet50", "real input / in-memory, N=1"): ("min", 0.95),
        ("imagenet_overhead", "trivial model: project Estimator / bare tf.data loop"):
            ("min", 0.95),
    }


def _measurement(model, name, cpu_ms):
    case = next(c for c in bench_plan.cases_for(model) if c.name == name)
    return bench_results.Measurement(case, 0, ok=True, examples_per_sec=100.0,
                                     burst_examples_per_sec=[100.0] * len(cpu_ms),
                                     cpu_ms_per_step=float(np.mean(cpu_ms)),
                                     burst_cpu_ms_per_step=list(cpu_ms))


def test_the_pipeline_target_is_examples_per_cpu_second_burst_by_burst():
    project = _measurement("imagenet_input", "project input alone 64 px", [10.0, 20.0, 10.0])
    r1 = _measurement("imagenet_input", "Model Garden r1 input alone 64 px", [14.0, 20.0, 12.0])
    rows = bench_results.target_rows(bench_plan.Options(models=("imagenet_input",)),
                                     [project, r1])
    row = next(t for t in rows if t["target"].endswith("64 px"))
    assert math.isclose(row["ratio"], 1.2) and row["met"] is False  # median of 1.4, 1.0, 1.2
    assert "note" not in row  # its wall time depends on how long it waited at the gate


class CpuGate:
    """Lets one burst of 2 steps through, then quits; 3 s of CPU pass at each wait."""

    def __init__(self, cpu):
        self.cpu, self.reports, self.commands = cpu, [], ["run 2", "quit"]

    def report(self, message):
        self.reports.append(message)

    def command(self):
        self.cpu[0] += 3.0  # the pipeline refills its buffers while it waits
        return self.commands.pop(0)


def test_a_pipelines_burst_cpu_counts_from_its_last_report(monkeypatch):
    """What a pipeline prepares while it waits at the gate is in the next burst's CPU time."""
    cpu = [0.0]
    monkeypatch.setattr(bench_cases.time, "process_time", lambda: cpu[0])

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(bench_cases.os, "_exit", leave)
    for counted, expected in ((True, 5.0), (False, 2.0)):
        cpu[0] = 0.0
        gate = CpuGate(cpu)
        clock = bench_cases.Clock({"warmup": 1, "t0": 0.0, "cpu_from_report": counted}, gate)
        clock.step_done()  # ready, then the wait
        cpu[0] += 1.0
        clock.step_done()
        cpu[0] += 1.0
        with pytest.raises(SystemExit):
            clock.step_done()  # the burst's report, then "quit"
        assert gate.reports[1]["cpu_seconds"] == expected


@pytest.mark.timeout(600)
def test_quick_imagenet_bench_prints_targets_a_to_c_with_met_or_missed(tmp_path):
    out = tmp_path / "bench"
    proc = run_cli("bench", "--models", "imagenet", "--quick", "--output_dir", out, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case in bench_plan.selected_cases(bench_plan.Options(
            models=bench_plan.IMAGENET_PARTS, quick=True)):
        assert case.name in proc.stdout
    lines = proc.stdout.splitlines()
    for model, label in [("imagenet_input", "input alone, per CPU-second: project / r1, 64 px"),
                         ("resnet50", "project none / Keras fit, N=1"),
                         ("resnet50", "real input / in-memory, N=1"),
                         ("imagenet_overhead",
                          "trivial model: project Estimator / bare tf.data loop")]:
        line = next(l for l in lines if l.startswith(model) and label in l)
        assert " met " in line or " MISSED " in line, line
    # the pixels-only floor: a ratio, no goal
    floor = next(l for l in lines if "r1 pixels-only / r1, 64 px" in l)
    assert floor.startswith("imagenet_input") and " - " in floor, floor
    assert not (out / "work").exists()
