"""Rift: which tools the index cannot tell apart (clusters, margins, distinguishing tokens)."""
