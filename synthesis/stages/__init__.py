"""The pipeline's stages, in order: themes, dedup, skeletons, assessment, scenarios and states, replay, publishing; variants."""
