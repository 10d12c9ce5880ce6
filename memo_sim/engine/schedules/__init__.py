"""The simulator's schedules, one module each, registered by name (`registry`):

- ``single_stage`` (`single_stage`): no pipeline; one representative GPU runs every layer, the
  iteration's micro-batches one after the other (gradient accumulation), per activation policy.
- ``sppo`` (`sppo`): SPPO's subsequence pipeline, one representative GPU per stage.
- ``1f1b`` (`one_f_one_b`) and ``interleaved_1f1b`` (`interleaved`): the micro-batch pipelines,
  each module giving its per-rank order of forward and backward steps (warm-up, steady state,
  cool-down) to the builder they share (`microbatch`), for every activation policy.

`memo_sim.engine.simulate.simulate` looks the runner up by the schedule's name; nothing else
branches on it. A new schedule needs: its name in `memo_sim.layout.schedule` (the plan's
vocabulary, with its rules in `check_schedule`), its engine module here (registered with
`registry.register_schedule`, imported below), its search strategy (`memo_sim.search.schedules`:
how the analytic tier prices it and which layouts and micro-batch sizes the what-if enumerates
for it) and its executor module in memo_exec (registered under the same name).
"""

from memo_sim.engine.schedules.registry import register_schedule, registered_schedules, schedule_runner
from memo_sim.engine.schedules.single_stage import (  # noqa: F401  (the single-stage builder's names)
    LayerPlan, Schedule, build_iteration, collective_link, emit_chain, layer_plan, layer_signature, middle_layer,
    representative_device,
)
from memo_sim.engine.schedules import sppo as _sppo  # noqa: F401,E402  (registers "sppo")
from memo_sim.engine.schedules import one_f_one_b as _one_f_one_b  # noqa: F401,E402  (registers "1f1b")
from memo_sim.engine.schedules import interleaved as _interleaved  # noqa: F401,E402  (registers "interleaved_1f1b")

__all__ = ["LayerPlan", "Schedule", "build_iteration", "collective_link", "emit_chain", "layer_plan",
           "layer_signature", "middle_layer", "register_schedule", "registered_schedules", "representative_device",
           "schedule_runner"]
