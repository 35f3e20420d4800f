"""ddtree-ops control plane: runs on the operator machine; never imports torch."""
