"""One decode step through the forward: trees in the flat batch, tree-masked attention, verification, KV compaction."""
