"""`tfrun train --tensorboard`: the metrics rows also as TensorBoard scalars, under OUT/tensorboard/ (rank 0).

metrics.jsonl stays the source of truth; this writes what it says, row by row, through torch's SummaryWriter
(the `tensorboard` package, an optional extra, imported only when asked for). Scalars, by TensorBoard tag:
  train/loss, train/lr, train/grad_norm (before clipping), train/tokens_per_s   every step
  eval/loss                                                                    when evaluated
  freeze_ratio/stage{s}                                                        every step, per stage
  noise_scale_tokens/stage{s}                                                  measured steps, per stage
A resumed run appends to the same folder; its steps continue the sequence.
"""

from __future__ import annotations

from pathlib import Path

from tfrun.errors import TfrunError

FOLDER = "tensorboard"


def check_tensorboard() -> None:
    """Raise one line when --tensorboard cannot work here (before any rank starts)."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise TfrunError("--tensorboard needs the tensorboard package: pip install 'timelyfreeze[tb]' "
                         "(or pip install tensorboard)") from None


class TensorBoardLog:
    """Rank 0's event files; `append` takes the rows metrics.jsonl gets."""

    def __init__(self, out: Path) -> None:
        check_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(out) / FOLDER))

    def append(self, rows: list[dict]) -> None:
        for row in rows:
            if "loss" not in row or "step" not in row:
                continue  # an event row (the online mode's phases and plans)
            step = row["step"]
            for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                             ("train/tokens_per_s", "tokens_per_s"), ("eval/loss", "eval_loss")):
                if row.get(key) is not None:
                    self.writer.add_scalar(tag, row[key], step)
            for name in ("freeze_ratio", "noise_scale_tokens"):
                for s, value in enumerate(row.get(name) or []):
                    if value is not None:
                        self.writer.add_scalar(f"{name}/stage{s}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
