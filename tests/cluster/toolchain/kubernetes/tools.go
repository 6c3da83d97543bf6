//go:build tools

// Package tools pins the Kubernetes control-plane commands that tests/cluster runs.
// build.sh builds them with `go build k8s.io/kubernetes/cmd/<name>` inside this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
