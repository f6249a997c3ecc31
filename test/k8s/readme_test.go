package k8s

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestReadmeNamesExistingK8sPaths: every deploy/k8s path README.md names
// exists, and a file it calls "the overlay's" is in every overlay it names:
// a reader who follows the Kubernetes section finds each file it points at.
func TestReadmeNamesExistingK8sPaths(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	paths := map[string]bool{}
	for _, p := range regexp.MustCompile(`deploy/k8s(?:/[A-Za-z0-9_.-]*[A-Za-z0-9_-])*`).FindAllString(readme, -1) {
		paths[p] = true
	}
	var overlays []string
	for p := range paths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("README.md names %s: %v", p, err)
		}
		if m := regexp.MustCompile(`^deploy/k8s/overlays/[^/]+$`).FindString(p); m != "" {
			overlays = append(overlays, m)
		}
	}
	if len(paths) == 0 || len(overlays) == 0 {
		t.Fatalf("README.md names no deploy/k8s paths or overlays (%d paths): the check would pass on nothing", len(paths))
	}
	sort.Strings(overlays)
	for _, m := range regexp.MustCompile("the overlay's `([^`]+)`").FindAllStringSubmatch(readme, -1) {
		for _, o := range overlays {
			if _, err := os.Stat(filepath.Join(root, o, m[1])); err != nil {
				t.Errorf("README.md points at the overlay's %s, which %s has not (%v): name the file by its path", m[1], o, err)
			}
		}
	}
	t.Logf("README.md names %d deploy/k8s paths: %s", len(paths), strings.Join(keys(paths), ", "))
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
