"""The paper's Table 3 rows (A)-(D), scaled to the Multi30k default, at one CPU budget for every run.

    transformer-experiment experiments/recipes/table3_multi30k.py --base=configs/multi30k.py --seeds=2 \
        --root=runs/experiments/table3_multi30k

The built-in `table3` grid applies the paper's absolute values, which only suit the paper's base
(d_model 512, h 8, N 6, d_ff 2048): on configs/multi30k.py (d_model 256, h 4, N 2, d_ff 1024) several of
them are the default itself (h 4, N 2, d_model 256, d_ff 1024) and others are out of a CPU's reach
(d_model 1024). This grid takes the paper's changes relative to its base instead:
  (A) heads at constant compute, d_k = d_v = d_model / h: 1/8, 1/2, 2 and 4 times the base's heads
      (the paper's 1, 4, 16, 32 around 8; here 1, 2, 8, 16 around 4; d_k 256 down to 16);
  (B) d_k alone at 1/4 and 1/2 of the base's 64 (16 and 32, as in the paper);
  (C) depth one layer less and one and two more (the paper went 2, 4, 8 around 6), width and d_ff halved
      and doubled (with d_k = d_model / h);
  (D) dropout 0 and 0.2, label smoothing 0 and 0.2 (the paper's values).
Row (E), the positional encodings, is the `positional` grid, trained to the end with 3 seeds
(experiments/results/positional_full/).

Every run trains STEPS steps, a quarter of the default's 4,800 (its first ~6 minutes on the 2-core VM):
what a CPU can afford for 36 runs (18 variants x 2 seeds). Steps are equal across the whole table,
so a row compares its variants at equal updates, not at equal time (a wider model's step costs more).
Results: experiments/results/table3_multi30k/.
"""

from transformer.sweeps.grids import Grid, Variant

STEPS = 1200


def get_grid():
  row = lambda label, name, overrides: Variant(name, {**overrides, "train.steps": STEPS}, label)
  variants = [Variant("base", {"train.steps": STEPS})]
  variants += [row("(A)", f"A-h{h}", {"model.num_heads": h}) for h in (1, 2, 8, 16)]
  variants += [row("(B)", f"B-dk{k}", {"model.d_k": k}) for k in (16, 32)]
  variants += [row("(C)", f"C-N{n}", {"model.num_layers": n}) for n in (1, 3, 4)]
  variants += [row("(C)", f"C-d{d}", {"model.d_model": d}) for d in (128, 512)]
  variants += [row("(C)", f"C-ff{f}", {"model.d_ff": f}) for f in (512, 2048)]
  variants += [row("(D)", f"D-drop{p}", {"model.dropout": p}) for p in (0.0, 0.2)]
  variants += [row("(D)", f"D-ls{e}", {"train.label_smoothing": e}) for e in (0.0, 0.2)]
  return Grid("table3_multi30k", variants)
