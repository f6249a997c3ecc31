package k8s

import "time"

// What the README's Kubernetes section states, and the tests hold the
// manifests to.
const (
	// MaxUnanswerable bounds how long any product goes without a 200 from
	// every pod during a rolling update of the prod StatefulSet (the
	// rehearsal, TestStatefulSetRehearsal). The README states it.
	MaxUnanswerable = 2 * time.Second
	// MaxOwnerAway bounds how long a product goes without an answer from
	// the pod running its task (a 200 not marked stale): the restarted
	// pod's SIGTERM, exit, start and rejoin. The README states it.
	MaxOwnerAway = 10 * time.Second
	// MinStartupBudget is the least failureThreshold × periodSeconds of
	// the startup probe: the time a pod has for a full restore.
	MinStartupBudget = 10 * time.Minute
	// MeasuredPeakRSS is the highest peak RSS measured for one process
	// (statefulset.yaml's comment): the memory request covers it.
	MeasuredPeakRSS = 394 << 20
	// StateVolumeMount is where the image keeps its state
	// (/shared-volume/state_store, the Dockerfile's SALESAGG_STATE_DIR).
	StateVolumeMount = "/shared-volume"
	// RunAs is the image's non-root user and group.
	RunAs = 65532
)
