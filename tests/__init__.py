"""Kube-Pathways test suites: unit, integration and cluster tiers."""
