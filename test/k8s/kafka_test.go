//go:build e2e

package k8s

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// buildSalesagg builds cmd/salesagg into dir, or copies the binary
// K8S_REHEARSAL_BIN names there (one built beforehand).
func buildSalesagg(t *testing.T, root, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "salesagg")
	if prebuilt := os.Getenv("K8S_REHEARSAL_BIN"); prebuilt != "" {
		b, err := os.ReadFile(prebuilt)
		if err == nil {
			err = os.WriteFile(bin, b, 0o755)
		}
		if err != nil {
			t.Fatalf("K8S_REHEARSAL_BIN: %v", err)
		}
		t.Logf("using %s (K8S_REHEARSAL_BIN)", prebuilt)
		return bin
	}
	t0 := time.Now()
	if out, err := harness.Build(root, bin); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(t0).Round(time.Millisecond))
	return bin
}
