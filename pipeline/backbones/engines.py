"""Who runs a backbone's forward pass: torch, or ONNX Runtime on the CPU.

- ``torch``: the module itself, channels-last, mixed precision on a GPU (``runtime.autocast``).
  The engine for GPUs, and the CPU fallback when ONNX Runtime is not installed.
- ``onnxruntime``: the same network exported once to an ONNX graph (TorchScript exporter,
  dynamic batch, fixed input size) and run by ONNX Runtime's CPU provider with one intra-op
  thread per core torch would use (``torch.get_num_threads()``: the cores, or OMP_NUM_THREADS).
  Its fused kernels run EfficientNet-Lite0 about 8× faster
  than torch eager on a CPU (bench/results/extract.json), with features equal to torch's within 1e-4.
- ``auto``: ``onnxruntime`` on the CPU when the ``onnx`` extra is installed, else ``torch``.

ONNX Runtime gets at most ``ORT_BATCH`` network inputs per call: a 10-crop batch of 32
images is 320 inputs, whose activations at once grew the session's memory arena by several
GB (about 1.2 million page faults over the first two calls) and ran at half the speed of the
same crops in calls of 32.  Features do not depend on that split, nor on the thread count
(measured bit-identical for Lite0 and Lite2 here; the tests allow EXPORT_TOLERANCE).

The exported graph is a cache: ``<onnx dir>/<backbone>-<weights sha256[:16]>-<input size>[-grid].onnx``,
built on first use (checked against torch on a random batch, then written atomically), reused
after; a file under that name is only ever a complete graph of those weights.  When it cannot
be written (a full disk, a read-only folder) the run goes on from the graph in memory.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import warnings
from pathlib import Path

import numpy as np
import torch

from pipeline.backbones.cnns import Backbone
from pipeline.core import runtime
from pipeline.core.errors import VseError
from pipeline.core.fsutil import write_atomic

ENGINES = ("auto", "torch", "onnxruntime")
ONNX_OPSET = 17
EXPORT_TOLERANCE = 1e-4  # max |ORT - torch| on the export check (and the engine tests)
INPUT, OUTPUT = "images", "features"
ORT_BATCH = 32  # network inputs per ONNX Runtime call (see the module docstring)


def onnxruntime_installed() -> bool:
    """Both halves of the ``onnx`` extra: the exporter's ``onnx`` and the runtime."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def resolve_engine(name: str, device: torch.device) -> str:
    """``auto`` → ``onnxruntime`` on the CPU when installed, else ``torch``; checks the others."""
    if name not in ENGINES:
        raise VseError(f"unknown engine {name!r} (expected {', '.join(ENGINES)})")
    if name == "auto":
        return "onnxruntime" if device.type == "cpu" and onnxruntime_installed() else "torch"
    if name == "onnxruntime":
        if device.type != "cpu":
            raise VseError(f"--engine onnxruntime runs on the CPU, not {device}; "
                           "use --engine torch (or auto) on a GPU")
        if not onnxruntime_installed():
            raise VseError("--engine onnxruntime needs the packages onnx and onnxruntime "
                           "(pip install 'vse[onnx]')")
    return name


class TorchEngine:
    """``engine(x)``: normalised float (N, 3, S, S) on ``device`` → (N, D) features."""

    name = "torch"
    channels_last = True  # faster convolutions on GPUs (tensor cores) and CPUs (oneDNN)
    in_loader_workers = False  # runs in the main process; the loader workers only decode

    def __init__(self, backbone: Backbone, device: torch.device):
        self.device = device
        self.model = backbone.module.to(device, memory_format=torch.channels_last)

    @property
    def precision(self) -> str:
        return engine_precision("torch", self.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), runtime.autocast(self.device):
            return self.model(x)


class OnnxRuntimeEngine:
    """The backbone's exported graph in an ONNX Runtime CPU session (same call as TorchEngine).

    ``in_loader_workers``: extraction runs this engine inside each DataLoader worker, one
    thread per worker (``with_threads``), next to that worker's decoding, instead of one
    multi-threaded session fed by the workers.  On 2 cores a decoding worker beside a
    2-thread session slows every call by about the decode time (the session waits for its
    descheduled thread), which held end to end at 0.7 of the forward alone; one single-thread
    session per core runs as fast as one 2-thread session (Lite0: 102 against 165-186 img/s)
    and leaves nothing to wait for.
    """

    name = "onnxruntime"
    channels_last = False  # the graph takes plain NCHW
    device = torch.device("cpu")
    precision = "float32"
    in_loader_workers = True

    def __init__(self, backbone: Backbone, onnx_dir, threads: int | None = None):
        self.graph = graph_path(backbone, onnx_dir)
        self.source: Path | bytes = self.graph
        if not self.graph.is_file():
            self.source = export_graph(backbone)
            try:
                write_atomic(self.graph, self.source)
                self.source = self.graph
            except VseError:  # only a cache (a full disk, a read-only folder): run from memory
                pass
        self.session = _session(self.source, threads)

    def with_threads(self, threads: int) -> OnnxRuntimeEngine:
        """The same graph in a new session with ``threads`` intra-op threads (a loader worker's)."""
        copy = object.__new__(OnnxRuntimeEngine)
        copy.graph, copy.source = self.graph, self.source
        copy.session = _session(self.source, threads=threads)
        return copy

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().to("cpu", torch.float32).contiguous().numpy()
        parts = [self.session.run([OUTPUT], {INPUT: x[a:a + ORT_BATCH]})[0]
                 for a in range(0, len(x), ORT_BATCH)]
        return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))


def engine_precision(engine: str, device: torch.device) -> str:
    """The float type the forward pass runs in (a cache attribute)."""
    if engine == "onnxruntime":
        return OnnxRuntimeEngine.precision
    context = runtime.autocast(device)
    dtype = context.fast_dtype if isinstance(context, torch.autocast) else torch.float32
    return str(dtype).removeprefix("torch.")


def engine_version(engine: str) -> str:
    """The installed version of the engine's package (a cache attribute)."""
    return importlib.metadata.version(engine)


def build_engine(name: str, backbone: Backbone, device: torch.device, onnx_dir=None):
    """The engine ``name`` (resolved: not ``auto``) for ``backbone``; ``onnx_dir`` holds graphs."""
    if name == "onnxruntime":
        if onnx_dir is None:
            raise ValueError("the onnxruntime engine needs a folder for its graphs")
        return OnnxRuntimeEngine(backbone, onnx_dir)
    return TorchEngine(backbone, device)


def graph_path(backbone: Backbone, onnx_dir) -> Path:
    """Where the graph of these weights at this input size lives (the weights' digest is the key)."""
    size = backbone.preprocessing.image_size
    output = "" if backbone.grid is None else "-grid"  # the feature map's cells, not their mean
    return Path(onnx_dir) / f"{backbone.name}-{backbone.weights_sha256[:16]}-{size}{output}.onnx"


def export_graph(backbone: Backbone) -> bytes:
    """``backbone.module`` (CPU, float32, eval) as a serialized ONNX graph, once ONNX Runtime
    is seen to compute what torch computes on a random batch."""
    module = backbone.module.to("cpu", memory_format=torch.contiguous_format).eval()
    size = backbone.preprocessing.image_size
    example = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and folding notes
        try:
            torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=ONNX_OPSET,
                              input_names=[INPUT], output_names=[OUTPUT],
                              dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}})
        except Exception as exc:  # the exporter raises many types; none is the user's input
            raise VseError(f"cannot export {backbone.name} to ONNX ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from exc
        expected = module(example).numpy()
    got = _session(buffer.getvalue(), threads=None).run([OUTPUT], {INPUT: example.numpy()})[0]
    difference = float(np.abs(got - expected).max())
    if not difference <= EXPORT_TOLERANCE:
        raise VseError(f"the ONNX graph of {backbone.name} differs from torch by {difference:.2e} "
                       f"(> {EXPORT_TOLERANCE}); use --engine torch")
    return buffer.getvalue()


def _session(graph, threads: int | None):
    """An ONNX Runtime CPU session of ``graph`` (a path or the serialized bytes)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    # idle threads sleep instead of spinning: the loader's decoding processes share these cores
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        source = str(graph) if isinstance(graph, Path) else graph
        return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's errors are its own pybind types
        reason = f"ONNX Runtime cannot load the graph ({(str(exc).splitlines() or [''])[0][:160]})"
        if isinstance(graph, Path):
            raise VseError(f"{reason}; delete the file to rebuild it", graph) from exc
        raise VseError(f"{reason}; use --engine torch") from exc
