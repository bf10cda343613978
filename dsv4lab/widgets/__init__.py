"""ipywidgets explorers, one knob each, one module per notebook (live.py: what several share). Every
function returns the widget (an ``ipywidgets.interactive``), which also works headless: the view is drawn
once on creation, so nbval can execute the cells without a frontend.

Recorded numbers come from a table the notebook passes in (data/runs). The widgets that run a kernel
at their setting (notebooks 00 to 05) do so in every mode, through Triton's interpreter at a small
shape on a CPU, check the result against the float64 reference, and on a CUDA GPU get a "time live"
box that times the selected configuration with dsv4lab.bench. The later ones read recorded runs:
06a's also runs two stages' tiny step now, 07's and 07a's compute from the recorded costs (the
sensitivity, the bridge), 08's checks the Hopper kernel itself where the process can run it, and
09's runs S5's step now with the fusions ticked (launches, logits against S4's; on a GPU a timing). Each widget's view is a plain function of its settings
(``tiles_view``, ``split_view``), which tests call at every setting.

The notebooks, the tests and the README call ``widgets.<function>``: the names below are the
package's face.
"""
from .after_the_story import (count_launches, explore_fusions, fusion_check, fusion_table,  # noqa: F401
                              fusion_view, launches_per_layer)
from .decode_step import (explore_stages, recorded_stage_table, stage_agreement, stage_pair_view,  # noqa: F401
                          tiny_batch, tiny_step)
from .head_batched import (STORY_BLOCK_HS, explore_tiles, recorded_head_block, story_check,  # noqa: F401
                           story_shape, tiles_view, time_story_live)
from .heads_per_program import (HEADS_PER_PROGRAM, explore_heads_per_program, heads_per_program_table,  # noqa: F401
                                heads_per_program_view, recorded_at_heads)
from .hopper import explore_hopper, hopper_batch_view, hopper_live_check  # noqa: F401
from .indexer_max_context import (INDEXER_LIVE_IMPLS, explore_indexer_max, indexer_max_check,  # noqa: F401
                                  indexer_max_shape, indexer_max_view)
from .indexer_step import (explore_indexer_step, indexer_step_check, indexer_step_shape,  # noqa: F401
                           indexer_step_view, time_indexer_step_live)
from .kernels_vs_floor import (explore_kernels_vs_floor, kernel_floor_view, kernels_vs_floor,  # noqa: F401
                               recorded_impls, recorded_us)
from .live import live_check  # noqa: F401
from .sensitivity import (explore_sensitivity, sensitivity_costs, sensitivity_grid, sensitivity_options,  # noqa: F401
                          sensitivity_view)
from .split_k import (explore_split, recorded_tiles, split_check, split_shape, split_view,  # noqa: F401
                      time_split_live)
from .split_k import _tile_config  # noqa: F401  (tests/test_runs.py rebuilds a sweep row's TileConfig with it)
from .story_vs_lab import BRIDGED, bridge_gpus, explore_story_vs_lab, story_row_view  # noqa: F401
