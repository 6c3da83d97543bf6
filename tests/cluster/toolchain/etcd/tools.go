//go:build tools

// Package tools pins the etcd server that tests/cluster runs; build.sh builds it with
// `go build go.etcd.io/etcd/server/v3` inside this module.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
