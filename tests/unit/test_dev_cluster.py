"""What a failed dev-cluster start says about the chart's pods."""

from __future__ import annotations

from pathways_devcluster.dev_cluster import pod_states

NOT_FOUND = 'exec: "/tmp/ci/.venv/bin/python": executable file not found in $PATH'


def test_a_failed_install_names_each_containers_state_and_how_its_last_run_ended() -> None:
    operator = {
        "metadata": {"name": "kube-pathways-operator-x"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "operator",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 128,
                            "reason": "StartError",
                            "message": NOT_FOUND,
                        }
                    },
                }
            ],
        },
    }
    pending = {"metadata": {"name": "other"}, "status": {"phase": "Pending"}}
    assert pod_states([operator, pending]) == [
        "pod kube-pathways-operator-x (Running) container operator: waiting CrashLoopBackOff "
        f"(back-off); last run terminated StartError exit code 128 ({NOT_FOUND})",
        "pod other (Pending): no container started yet",
    ]
