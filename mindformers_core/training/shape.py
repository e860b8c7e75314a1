"""The job's shape as the trainer reads it from a validated config: parallel sizes, batch
multipliers, execution mode. One place, so the parts of the trainer agree on what a key means.
Pure logic: no process group needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .config import Config


@dataclass(frozen=True)
class JobShape:
    dp: int
    tp: int
    cp: int
    pp: int
    vpp: int                 # virtual stages per pipeline rank (1 without a pipeline)
    micro_batch_num: int     # microbatches per schedule run (1 without a pipeline)
    accumulate: int          # gradient_accumulation_steps
    jit: bool                # context.mode 0: compiled steps
    sharded_dp: bool         # parallel.enable_parallel_optimizer: hsdp owns the data-parallel reduction
    predicting: bool
    scheduler: str
    rank_order: str

    @classmethod
    def from_config(cls, cfg: Config) -> "JobShape":
        pc, pipe = cfg.parallel_config, cfg.parallel.pipeline_config
        pp = int(pc.pipeline_stage)
        return cls(dp=int(pc.data_parallel), tp=int(pc.model_parallel), cp=int(pc.context_parallel), pp=pp,
                   vpp=int(pipe.pipeline_interleave) if pp > 1 else 1,
                   micro_batch_num=int(pc.micro_batch_num) if pp > 1 else 1,
                   accumulate=int(cfg.runner_config.gradient_accumulation_steps),
                   jit=int(cfg.context.mode) == 0,
                   sharded_dp=bool(cfg.parallel.enable_parallel_optimizer),
                   predicting=cfg.run_mode == "predict",
                   scheduler=pipe.pipeline_scheduler,
                   rank_order=str(pc.get("rank_order", "tp-cp-ep-dp-pp")))

    @property
    def workers(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    @property
    def mode_name(self) -> str:
        return "jit" if self.jit else "pynative"

    def world_problem(self, world: int, what: str) -> Optional[str]:
        """The error line when the parallel sizes do not multiply to ``world`` workers, else None."""
        if self.workers == world:
            return None
        return (f"parallel_config = data_parallel {self.dp} x model_parallel {self.tp} x context_parallel "
                f"{self.cp} x pipeline_stage {self.pp} = {self.workers}: must equal {what} {world}")
