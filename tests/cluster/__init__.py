"""Cluster tier: tests against a real etcd + Kubernetes control plane and a test node agent."""
