"""One model across several machines at boot: who is in the cluster, who leads, and how the nodes stay in step."""
