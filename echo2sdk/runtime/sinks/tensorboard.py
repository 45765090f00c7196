"""The `tensorboard` sink: event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`).

Written with the `tensorboard` package's own event writer (no TensorFlow, no torch): one scalar per metric
(nested dicts flattened, ``task/correct``), tables as markdown text (the Text tab), histograms as
histograms (one bucket per integer value), and the config as text at step 0. Needs the `tensorboard`
extra.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from echo2sdk.errors import DependencyNotInstalled
from echo2sdk.runtime.sinks import columns, flatten, sorted_counts

__all__ = ["TensorBoardSink", "markdown_table"]

#: Longest cell of a text table (characters); TensorBoard renders long cells poorly.
MAX_CELL = 500


class TensorBoardSink:
    """Scalars, text tables and histograms in RUN_DIR/tensorboard/events.out.tfevents.*."""

    def __init__(self) -> None:
        self._writer: Any = None

    def open(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from tensorboard.compat.proto import summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise DependencyNotInstalled("tensorboard", "tensorboard") from None
        self._pb = summary_pb2
        self.logdir = Path(run_dir) / "tensorboard"
        self._writer = EventFileWriter(str(self.logdir))
        text = "    " + json.dumps(config, indent=2, default=str).replace("\n", "\n    ")  # a markdown code block
        self._emit(0, [self._text_value("config", text)])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = [self._pb.Summary.Value(tag=k, simple_value=v) for k, v in flatten(metrics).items()]
        if values:
            self._emit(step, values)

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        self._emit(step, [self._text_value(name, markdown_table(rows))])

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        pairs = sorted_counts(counts)
        if not pairs:
            return
        lo, hi = pairs[0][0], pairs[-1][0]
        dense = dict(pairs)
        buckets = [float(dense.get(k, 0)) for k in range(lo, hi + 1)]  # one bucket per integer, gaps as zeros
        histo = self._pb.HistogramProto(
            min=float(lo), max=float(hi), num=float(sum(c for _, c in pairs)),
            sum=float(sum(k * c for k, c in pairs)), sum_squares=float(sum(k * k * c for k, c in pairs)),
            bucket_limit=[k + 0.5 for k in range(lo, hi + 1)], bucket=buckets,
        )
        self._emit(step, [self._pb.Summary.Value(tag=name, histo=histo)])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # flushes
            self._writer = None

    def _text_value(self, tag: str, text: str) -> Any:
        """A Summary.Value the Text plugin shows: a string tensor tagged with plugin "text"."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

        meta = self._pb.SummaryMetadata(plugin_data=self._pb.SummaryMetadata.PluginData(plugin_name="text"))
        shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()], tensor_shape=shape)
        return self._pb.Summary.Value(tag=tag, metadata=meta, tensor=tensor)

    def _emit(self, step: int, values: list[Any]) -> None:
        from tensorboard.compat.proto import event_pb2

        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=self._pb.Summary(value=values)))
        self._writer.flush()  # a crashed run keeps every step it logged


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """`rows` as a markdown table (pipes and newlines escaped, cells cut to MAX_CELL characters)."""
    cols = columns(rows)
    if not cols:
        return "(empty table)"

    def cell(v: Any) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        if len(text) > MAX_CELL:
            text = text[: MAX_CELL - 3] + "..."
        return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
