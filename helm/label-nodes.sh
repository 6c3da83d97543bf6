#!/usr/bin/env bash
# Turns a cluster's worker Nodes into Pathways islands, the way `make kind-up` needs:
# the i-th worker (by name) goes to island ISLANDS[i / WORKERS_PER_ISLAND] through the
# label pathways.dev/island, and advertises DEVICES of the extended resource
# pathways.dev/device by a JSON patch on the Node's /status subresource (capacity and
# allocatable; a kubelet keeps an extended resource once it is in capacity).
#
#   helm/label-nodes.sh [--context CTX] [--kubeconfig FILE] [--devices N] [NODE...]
#
# Without NODE arguments the workers are every Node without the control-plane role;
# their number must be exactly ${#ISLANDS[@]} x WORKERS_PER_ISLAND (helm/kind-config.yaml
# has that many). Re-running it is harmless: labels are overwritten, the patch is the same.
set -euo pipefail

ISLANDS=(island-a island-b)
WORKERS_PER_ISLAND=2
DEVICES=4

kubectl_args=()
nodes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --context) kubectl_args+=(--context "$2"); shift 2 ;;
    --kubeconfig) kubectl_args+=(--kubeconfig "$2"); shift 2 ;;
    --devices) DEVICES="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "label-nodes.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) nodes+=("$1"); shift ;;
  esac
done
case "$DEVICES" in
  ''|*[!0-9]*|0) echo "label-nodes.sh: --devices must be a positive integer, got '$DEVICES'" >&2; exit 2 ;;
esac

k() { kubectl "${kubectl_args[@]}" "$@"; }

expected=$(( ${#ISLANDS[@]} * WORKERS_PER_ISLAND ))
if [ "${#nodes[@]}" -eq 0 ]; then
  mapfile -t nodes < <(k get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
fi
if [ "${#nodes[@]}" -ne "$expected" ]; then
  echo "label-nodes.sh: expected $expected worker Nodes ($WORKERS_PER_ISLAND per island for" \
       "${ISLANDS[*]}), found ${#nodes[@]}: ${nodes[*]:-none}. Create the cluster from" \
       "helm/kind-config.yaml (make kind-up) or name the Nodes as arguments." >&2
  exit 1
fi

for i in "${!nodes[@]}"; do
  node="${nodes[$i]}"
  island="${ISLANDS[$(( i / WORKERS_PER_ISLAND ))]}"
  k label node "$node" "pathways.dev/island=$island" --overwrite >/dev/null
  patch="[{\"op\":\"add\",\"path\":\"/status/capacity/pathways.dev~1device\",\"value\":\"$DEVICES\"},"
  patch+="{\"op\":\"add\",\"path\":\"/status/allocatable/pathways.dev~1device\",\"value\":\"$DEVICES\"}]"
  k patch node "$node" --subresource=status --type=json -p "$patch" >/dev/null
  echo "node/$node: island $island, $DEVICES pathways.dev/device"
done
