"""The checkpoint format, one owner: `<run_dir>/checkpoints/step_000010/{hf/, state/, trainer_state.pt, meta.json}`.

- `layout`: the names and paths, reading a step's meta, the one completeness check, the latest and the list
  (no torch: planners and watchers use it without loading a model).
- `commit`: writing a step so readers never see half of one (temporary name, manifest in meta.json last,
  fsync, rename), removing and pruning steps, cleaning what killed saves left, the step to resume from.
- `adapter`: the PEFT adapter folder `hf/` is under LoRA (reading it, its base model, merging it).

`hf/` is a plain HF model folder (config, safetensors, tokenizer) that vLLM, transformers and the eval
packages read directly (under `policy.lora`: the PEFT adapter folder, adapter_config.json +
adapter_model.safetensors naming its base model, unless `save_hf_merged=true`), streamed out one gathered
parameter at a time, in `save_hf_dtype`. `state/` is the policy's model and optimizer state as
`torch.distributed.checkpoint` shards: every rank writes its own slices, and a job of any world size reads
them back resharded. `critic/` (PPO with a critic only) holds the value model's the same way.
`trainer_state.pt` holds the rest of what resuming needs (schedulers, RNG states of every rank, step, data
position, MLflow run id). Steps written before sharding (optimizer inside the trainer state,
`critic.pt`) still resume. What a training step puts in is train/checkpoint.py's; every other module
(loops, pipeline, model resolution, evals, watchers) asks this package for names and paths and never
spells them itself. It sits in infra/ because the evals and watchers read checkpoints as much as
training writes them; it imports nothing from train.
"""
