"""The all-five job (`tfopt-demo`, `make demo`): a keras-hub MoE language
model from architecture search to serving.

1. **search** (`tfopt.demo.search`): one-shot NAS over a Qwen3-MoE LM's
   shape (`tfopt.nas.moe_lm`) with an analyst's constraint; the chosen
   sub-network exported and carried on.
2. **train** (`tfopt.demo.train`): that model, whose training state is
   more than one device's cap, trained with `tfopt.compile(placement=
   "auto")` and CautiousAdamW across capped TensorFlow server tasks, under
   the launcher (heartbeats, checkpoints, MFU); a server task killed
   mid-run, the job resumed, its losses equal to a run without the fault.
3. **prune** (`tfopt.demo.prune`): MoE-Pruner at 50 % and expert-wise
   distillation from the dense model; perplexities on held-out text.
4. **export** (`tfopt.demo.serve`): the pruned model as a SavedModel,
   answered through TF Serving's request protos, against `model.predict`.

`tfopt.demo.report` writes `report.json` and a self-contained
`report.html`. Text and tokenizer are built in code (`tfopt.demo.text`):
nothing is downloaded.
"""
