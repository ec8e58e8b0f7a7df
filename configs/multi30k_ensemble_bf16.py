"""One member of the two-run ensemble recipe for CPUs with fast bf16 products (AVX512-BF16 or AMX).

    for s in 0 1; do transformer-train --config=configs/multi30k_ensemble_bf16.py --config.seed=$s \
        --workdir=runs/m30k_ens_bf16/seed$s; done
    transformer-eval --workdir=runs/m30k_ens_bf16/seed0 --ensemble=runs/m30k_ens_bf16/seed1

The bf16 recipe (configs/multi30k_bf16.py: bf16 products with float32 sums, dropout 0.2) stopped at
step 5,250, so that two seeds train in the default's 40 minutes where a bf16 step costs ~0.77x a
float32 one (a 2-core Zen 5 EPYC: 18m24s each, where configs/multi30k_ensemble.py's float32 members
take 19m25s to step 4,250), decoded together like configs/multi30k_ensemble.py's members (beam 4,
alpha 1.2). Neither the learning-rate schedule nor the moving average depends on train.steps, so
each member is the bf16 recipe's own step-5,250 checkpoint. Chosen on validation:
experiments/results/multi30k_test_sets/en-de/README.md. On a CPU without fast bf16 products
(`grep -c -e avx512_bf16 -e amx_bf16 /proc/cpuinfo` prints 0) a step is not cheaper and two members
exceed 40 minutes: use configs/multi30k_ensemble.py there.
"""

import runpy
from pathlib import Path


def get_config():
  # The bf16 recipe, run by path (config files are not a package on sys.path).
  c = runpy.run_path(str(Path(__file__).with_name("multi30k_bf16.py")))["get_config"]()
  c.train.steps = 5250
  c.decode.beam_size = 4
  c.decode.alpha = 1.2
  return c
