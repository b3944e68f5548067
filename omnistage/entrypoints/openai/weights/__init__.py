"""POST /v1/omni/update_weights: new weights for a stage without a restart (RL training loops,
fine-tune roll-outs); requests arriving meanwhile wait and run on the new weights."""
