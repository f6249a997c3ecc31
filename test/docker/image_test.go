//go:build docker

package docker

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// clusterImageRef is the project's image as the Kubernetes manifests name
// it; the saved tarball carries this tag, so that `ctr images import`
// gives the kubelet docker.io/library/salesagg:latest.
const clusterImageRef = "salesagg:latest"

// testRun is what every test here starts with: the repository, the cache,
// a temp dir of its own (removed at the end, with a check that no process
// of the run is left) and a phase timer.
type testRun struct {
	repo, cache, tmp string
	phase            func(string)
}

// begin sets a test of this package up: root, the cache, the temp dir and
// its cleanups, and the watchdog that stops the engine should the test die
// without its cleanups.
func begin(t *testing.T) *testRun {
	t.Helper()
	started := time.Now()
	if os.Geteuid() != 0 {
		t.Fatal("make test-docker starts a dockerd of its own and installs packages: it needs root")
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cache := cacheDir(t)
	// A short path: the engine's sockets live under it.
	tmp, err := os.MkdirTemp("", "salesagg-docker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(tmp); err != nil {
			t.Errorf("removing %s: %v", tmp, err)
		}
		t.Logf("total wall time %s", time.Since(started).Round(time.Second))
	})
	t.Cleanup(func() { checkNothingLeft(t, tmp) })
	startWatchdog(t, tmp, repo)
	return &testRun{repo: repo, cache: cache, tmp: tmp, phase: phaseTimer(t)}
}

// TestProjectImage makes sure the cache holds the project's image, built
// by `docker build` from the Dockerfile, for the sources as they are now,
// as a `docker save` tarball tagged salesagg:latest; with
// SALESAGG_IMAGE_OUT set, it puts a copy there. The cluster test
// (test/cluster) runs this test to load the very image a user builds into
// its containerd. After TestComposeWalkthrough (which saves the image it
// built) it only finds the tarball; alone, it builds the image (warm: the
// builder image cached, ~3 min on 2 cores).
func TestProjectImage(t *testing.T) {
	r := begin(t)
	key := projectImageKey(t, r.repo)
	saved := savedImagePath(r.cache, key)
	if err := checkSavedImage(saved); err == nil {
		t.Logf("the project's image for sources %s is cached: %s", key[:16], saved)
	} else {
		t.Logf("building the project's image for sources %s (%v)", key[:16], err)
		ensurePackages(t, false)
		e := startDockerd(t, filepath.Join(r.tmp, "engine"))
		r.phase("dockerd")
		_, golang := builderImages(t, e, r.cache, r.tmp)
		r.phase("builder image")
		image := buildImage(t, e, r.repo, golang)
		r.phase("project image")
		checkImage(t, e, image)
		saveProjectImage(t, e, r.cache, saved, image)
		r.phase("project image saved")
		if err := checkSavedImage(saved); err != nil {
			t.Fatal(err)
		}
	}
	out := os.Getenv("SALESAGG_IMAGE_OUT")
	if out == "" {
		return
	}
	if err := copyFile(saved, out); err != nil {
		t.Fatal(err)
	}
	t.Logf("copied the project's image to %s (SALESAGG_IMAGE_OUT)", out)
}

// projectImageKey names the sources an image is built from: a SHA-256 of
// the files the .dockerignore lets into the build context (go.mod, go.sum,
// scripts/build.sh, and cmd/ and internal/ without tests or testdata), path and content, and
// of the Go version of the builder image.
func projectImageKey(t *testing.T, repo string) string {
	t.Helper()
	h := sha256.New()
	fmt.Fprintf(h, "go %s\n", goEnv(t, "GOVERSION"))
	add := func(rel string) error {
		b, err := os.ReadFile(filepath.Join(repo, rel))
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	}
	for _, f := range []string{"go.mod", "go.sum", "Dockerfile", ".dockerignore", "scripts/build.sh"} {
		if err := add(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"cmd", "internal"} {
		var files []string
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if !d.IsDir() && !strings.HasSuffix(d.Name(), "_test.go") {
				rel, err := filepath.Rel(repo, p)
				if err != nil {
					return err
				}
				files = append(files, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(files)
		for _, f := range files {
			if err := add(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// savedImagePath is where the cache keeps the image of the sources key.
func savedImagePath(cache, key string) string {
	return filepath.Join(cache, "project-image-"+key[:16]+".tar")
}

// saveProjectImage tags image salesagg:latest, saves it into the cache as
// saved (savedImagePath of the sources' key) and removes the tarballs of
// other sources (one image of ~30 MB is kept).
func saveProjectImage(t *testing.T, e *engine, cache, saved, image string) {
	t.Helper()
	unlock := lockCache(t, cache)
	defer unlock()
	e.docker(t, "tag", image, clusterImageRef)
	defer e.docker(t, "rmi", clusterImageRef)
	tmp := saved + ".tmp"
	must(t, runOpts{env: e.env, timeout: 5 * time.Minute}, "docker", "save", "-o", tmp, clusterImageRef)
	if err := os.Rename(tmp, saved); err != nil {
		t.Fatal(err)
	}
	old, _ := filepath.Glob(filepath.Join(cache, "project-image-*.tar"))
	for _, f := range old {
		if f != saved {
			_ = os.Remove(f)
		}
	}
	st, err := os.Stat(saved)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("saved %s as %s into %s (%.1f MB)", image, clusterImageRef, saved, float64(st.Size())/1e6)
}

// checkSavedImage reports why the tarball at path is not a `docker save` of
// salesagg:latest: missing, unreadable, or a manifest naming other tags.
func checkSavedImage(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s has no manifest.json", path)
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return fmt.Errorf("%s: manifest.json: %w", path, err)
		}
		if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{clusterImageRef}) {
			return fmt.Errorf("%s: manifest.json names %+v, want one image tagged %s", path, m, clusterImageRef)
		}
		return nil
	}
}

// copyFile copies src to dst through a temporary file beside dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dst), ".image-*")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(out.Name(), dst)
}
