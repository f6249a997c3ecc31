//go:build docker

package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/test/harness"
)

// The Compose implementation: Compose v2, built once per machine from the Go
// module proxy and cached. Debian 12's docker-compose package (v1.29, Python)
// cannot run the override: it merges `ports` lists and refuses any port with
// network_mode: host ("host" network_mode is incompatible with port_bindings),
// and v1 has no `!reset` to drop the base file's ports; it is also end of
// life. v2 is what `docker compose` runs on users' machines.
const (
	composeModule  = "github.com/docker/compose/v2"
	composeVersion = "v2.40.3"
)

const imagePrefix = "salesagg-test"

// cmdResult is the outcome of one command.
type cmdResult struct {
	stdout, stderr string
	took           time.Duration
}

// runOpts tunes run.
type runOpts struct {
	dir     string
	env     []string // added to the environment
	stdin   io.Reader
	timeout time.Duration
	quiet   bool // do not log the command line
}

// run runs name args with a bounded time and returns its output; the error
// names the command, its exit status and the tail of its stderr.
func run(t *testing.T, o runOpts, name string, args ...string) (cmdResult, error) {
	t.Helper()
	if o.timeout == 0 {
		o.timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = o.dir
	cmd.Env = append(os.Environ(), o.env...)
	cmd.Stdin = o.stdin
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := cmdResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	line := name + " " + strings.Join(args, " ")
	if !o.quiet {
		t.Logf("$ %s  (%s)", line, res.took.Round(10*time.Millisecond))
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no end within %s", o.timeout)
		}
		// %w: a caller can read the exit code (*exec.ExitError).
		return res, fmt.Errorf("%s: %w\n%s", line, err, tail(res.stdout+res.stderr, 40))
	}
	return res, nil
}

// must is run that fails the test on an error.
func must(t *testing.T, o runOpts, name string, args ...string) cmdResult {
	t.Helper()
	res, err := run(t, o, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// cacheDir is where the slow parts are kept between runs on one machine:
// $SALESAGG_DOCKER_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/salesagg/docker.
func cacheDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SALESAGG_DOCKER_CACHE")
	if dir == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Fatal(err)
			}
			base = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(base, "salesagg", "docker")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// lockCache takes an exclusive lock on the cache dir (two runs on one machine
// make each cached file once) and returns the unlock.
func lockCache(t *testing.T, cache string) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }
}

// ensurePackages installs, with apt-get, the Debian packages whose commands
// are missing: docker.io (dockerd, docker), debootstrap (only when the
// Debian root file system is not cached yet), Java and Maven for kafka.sh.
// Package scripts are kept from starting services (no system dockerd with a
// bridge and iptables rules on the host).
func ensurePackages(t *testing.T, needDebootstrap bool) {
	t.Helper()
	want := []struct{ cmd, pkg string }{
		{"dockerd", "docker.io"}, {"docker", "docker.io"}, {"docker-init", "docker.io"},
		{"java", "openjdk-17-jdk-headless"}, {"mvn", "maven"},
	}
	if needDebootstrap {
		want = append(want, struct{ cmd, pkg string }{"debootstrap", "debootstrap"})
	}
	var pkgs []string
	for _, w := range want {
		if _, err := exec.LookPath(w.cmd); err != nil && !slices.Contains(pkgs, w.pkg) {
			pkgs = append(pkgs, w.pkg)
		}
	}
	if len(pkgs) == 0 {
		return
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Fatalf("missing %v and no apt-get to install them", pkgs)
	}
	const policy = "/usr/sbin/policy-rc.d"
	if _, err := os.Stat(policy); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(policy, []byte("#!/bin/sh\n# make test-docker: no service starts during its apt-get install\nexit 101\n"), 0o755); err == nil {
			defer os.Remove(policy)
		}
	}
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	must(t, runOpts{env: env, timeout: 5 * time.Minute}, "apt-get", "update", "-qq")
	must(t, runOpts{env: env, timeout: 10 * time.Minute}, "apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
}

// composeBinary returns the Compose command to use: $SALESAGG_COMPOSE when set
// (a path or a command name), else Compose v2 from the cache, built from the
// module proxy the first time (about 4 minutes on 2 cores).
func composeBinary(t *testing.T, cache, tmp string) string {
	t.Helper()
	if c := os.Getenv("SALESAGG_COMPOSE"); c != "" {
		return c
	}
	bin := filepath.Join(cache, fmt.Sprintf("docker-compose-%s-%s-%s", composeVersion, runtime.GOOS, runtime.GOARCH))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	unlock := lockCache(t, cache)
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	start := time.Now()
	// `go install module/cmd@version` refuses a module whose go.mod has
	// exclude directives, as Compose's has: build its source as the main
	// module instead, with its own go.mod. Its dependencies go to a module
	// cache and a build cache of this run's, removed afterwards.
	work := filepath.Join(tmp, "compose-build")
	env := []string{"GOMODCACHE=" + filepath.Join(work, "mod"), "GOCACHE=" + filepath.Join(work, "cache"),
		"GOFLAGS=-mod=readonly -buildvcs=false", "GOTOOLCHAIN=local", "CGO_ENABLED=0"}
	res := must(t, runOpts{env: env, timeout: 10 * time.Minute}, "go", "mod", "download", "-json", composeModule+"@"+composeVersion)
	var dir string
	for _, l := range strings.Split(res.stdout, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), `"Dir": `); ok {
			dir = strings.Trim(strings.TrimSuffix(v, ","), `"`)
		}
	}
	if dir == "" {
		t.Fatalf("go mod download %s@%s printed no Dir:\n%s", composeModule, composeVersion, res.stdout)
	}
	src := filepath.Join(work, "src")
	must(t, runOpts{}, "cp", "-r", dir, src)
	must(t, runOpts{}, "chmod", "-R", "u+w", src)
	out := bin + ".tmp"
	must(t, runOpts{dir: src, env: env, timeout: 20 * time.Minute}, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X "+composeModule+"/internal.Version="+composeVersion, "-o", out, "./cmd")
	if err := os.Rename(out, bin); err != nil {
		t.Fatal(err)
	}
	// The module cache is read-only to its owner: go clean removes it.
	_, _ = run(t, runOpts{env: env, quiet: true}, "go", "clean", "-modcache")
	_ = os.RemoveAll(work)
	t.Logf("built Compose %s from the module proxy in %s: %s", composeVersion, time.Since(start).Round(time.Second), bin)
	return bin
}

// engine is a dockerd of the test's own.
type engine struct {
	root   string // data root, exec root, socket, log
	host   string // DOCKER_HOST
	env    []string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startDockerd starts dockerd with the vfs storage driver, no bridge and no
// iptables rules (containers use the host's network), its data root, exec
// root, pid file, socket and log under root, and waits until it answers.
func startDockerd(t *testing.T, root string) *engine {
	t.Helper()
	e := &engine{root: root, exited: make(chan struct{})}
	sock := filepath.Join(root, "docker.sock")
	e.host = "unix://" + sock
	cfg := filepath.Join(root, "docker-config") // the client's: no user config, contexts or plugins
	for _, d := range []string{filepath.Join(root, "data"), filepath.Join(root, "exec"), cfg} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	daemonJSON := filepath.Join(root, "daemon.json")
	if err := os.WriteFile(daemonJSON, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.env = []string{"DOCKER_HOST=" + e.host, "DOCKER_CONFIG=" + cfg, "DOCKER_CONTEXT=", "DOCKER_BUILDKIT=0"}
	logf, err := os.Create(filepath.Join(root, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command("dockerd",
		"--storage-driver=vfs", "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
		"--userland-proxy=false", "--config-file", daemonJSON,
		"--data-root", filepath.Join(root, "data"), "--exec-root", filepath.Join(root, "exec"),
		"--pidfile", filepath.Join(root, "dockerd.pid"), "-H", e.host)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = logf.Close()
	go func() { _ = e.cmd.Wait(); close(e.exited) }()
	t.Cleanup(func() { e.stop(t) })
	took := harness.WaitFor(t, 90*time.Second, "dockerd to answer", func() error {
		select {
		case <-e.exited:
			return fmt.Errorf("%w: dockerd exited: %v\n%s", harness.ErrGiveUp, e.cmd.ProcessState, e.logTail())
		default:
		}
		_, err := run(t, runOpts{env: e.env, timeout: 10 * time.Second, quiet: true}, "docker", "version", "--format", "{{.Server.Version}}")
		return err
	})
	v := e.docker(t, "version", "--format", "client {{.Client.Version}}, engine {{.Server.Version}} (API {{.Server.APIVersion}})")
	t.Logf("dockerd (pid %d) answers at %s after %s: %s", e.cmd.Process.Pid, e.host, took.Round(10*time.Millisecond), strings.TrimSpace(v.stdout))
	return e
}

func (e *engine) logTail() string {
	b, _ := os.ReadFile(filepath.Join(e.root, "dockerd.log"))
	return tail(string(b), 30)
}

// docker runs the docker client against this engine.
func (e *engine) docker(t *testing.T, args ...string) cmdResult {
	t.Helper()
	return must(t, runOpts{env: e.env}, "docker", args...)
}

// stop ends dockerd (SIGTERM, SIGKILL after 60 s), then its containerd if it
// is left, and unmounts whatever is still mounted under the root.
func (e *engine) stop(t *testing.T) {
	select {
	case <-e.exited:
	default:
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(60 * time.Second):
			t.Logf("dockerd did not stop within 60 s: SIGKILL")
			_ = e.cmd.Process.Kill()
			<-e.exited
		}
	}
	// dockerd stops the containerd it started; one left after a SIGKILL is
	// ended by the pid in its pid file.
	if b, err := os.ReadFile(filepath.Join(e.root, "exec", "containerd", "containerd.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), e.root) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				// Gone only once its /proc entry is (it is not our child:
				// init reaps it), so that a later scan does not see it dying.
				for range 100 {
					if c, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(c), e.root) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
	unmountUnder(t, e.root)
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Logf("unmounting %s: %v", p, err)
		}
	}
}

// builderImages makes sure the engine has the Debian image and the Go builder
// image, and returns their names. Warm: `docker load` of the cached tarball
// (keyed by Go version, Debian suite and architecture). Cold: debootstrap a
// minimal Debian (its tarball cached too), `docker import` it, add the host's
// Go toolchain and CA certificates with a docker build, and `docker save`
// both images into the cache.
func builderImages(t *testing.T, e *engine, cache, tmp string) (debian, golang string) {
	t.Helper()
	goVersion := strings.TrimPrefix(goEnv(t, "GOVERSION"), "go")
	suite := debianSuite()
	debian = fmt.Sprintf("%s/debian:%s", imagePrefix, suite)
	golang = fmt.Sprintf("%s/golang:%s-%s", imagePrefix, goVersion, suite)
	saved := filepath.Join(cache, fmt.Sprintf("images-go%s-%s-gcc-%s.tar", goVersion, suite, runtime.GOARCH))

	unlock := lockCache(t, cache)
	defer unlock()
	if _, err := os.Stat(saved); err == nil {
		start := time.Now()
		if _, err := run(t, runOpts{env: e.env, timeout: 10 * time.Minute}, "docker", "load", "-q", "-i", saved); err == nil {
			t.Logf("loaded %s and %s from %s in %s", golang, debian, saved, time.Since(start).Round(100*time.Millisecond))
			return debian, golang
		} else {
			t.Logf("the cached images are unusable, making them again: %v", err)
			_ = os.Remove(saved)
		}
	}

	start := time.Now()
	rootfs := debianRootfs(t, cache, tmp, suite)
	must(t, runOpts{env: e.env, timeout: 10 * time.Minute}, "docker", "import",
		"--change", "CMD [\"bash\"]", rootfs, debian)

	goroot := goEnv(t, "GOROOT")
	dockerfile := fmt.Sprintf(`FROM %s
COPY go /usr/local/go
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV GOLANG_VERSION=%s GOPATH=/go GOTOOLCHAIN=local PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
`, debian, goVersion)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeBuilderContext(pw, dockerfile, goroot)) }()
	must(t, runOpts{env: e.env, stdin: pr, timeout: 15 * time.Minute}, "docker", "build", "--network", "host", "-q", "-t", golang, "-")
	v := must(t, runOpts{env: e.env}, "docker", "run", "--rm", "--network", "host", golang, "go", "version")
	t.Logf("made %s (%s) in %s", golang, strings.TrimSpace(v.stdout), time.Since(start).Round(time.Second))

	tmpSave := saved + ".tmp"
	must(t, runOpts{env: e.env, timeout: 10 * time.Minute}, "docker", "save", "-o", tmpSave, golang, debian)
	if err := os.Rename(tmpSave, saved); err != nil {
		t.Fatal(err)
	}
	// Images of other Go versions: a toolchain upgrade leaves no 400 MB behind.
	old, _ := filepath.Glob(filepath.Join(cache, "images-go*-"+runtime.GOARCH+".tar"))
	for _, f := range old {
		if f != saved {
			_ = os.Remove(f)
		}
	}
	return debian, golang
}

// writeBuilderContext writes the builder's build context as a tar stream:
// the Dockerfile, the Go toolchain (what building a module needs) and the
// host's CA bundle.
func writeBuilderContext(w io.Writer, dockerfile, goroot string) error {
	tw := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add("Dockerfile", []byte(dockerfile)); err != nil {
		return err
	}
	ca, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		return fmt.Errorf("the host's CA bundle (package ca-certificates): %w", err)
	}
	if err := add("ca-certificates.crt", ca); err != nil {
		return err
	}
	root, err := filepath.EvalSymlinks(goroot)
	if err != nil {
		return err
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		// Not needed to build a module: the toolchain's own tests, test data,
		// docs, and the sources of the go command and compiler (src/cmd; the
		// binaries are in bin/ and pkg/tool/).
		if d.IsDir() && (rel == "test" || rel == "api" || rel == "doc" || rel == "misc" || rel == "src/cmd" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(filepath.Join("go", rel))
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// debianRootfs returns the cached tarball of a minimal Debian root file
// system (debootstrap --variant=minbase), making it the first time.
func debianRootfs(t *testing.T, cache, tmp, suite string) string {
	t.Helper()
	tgz := filepath.Join(cache, fmt.Sprintf("rootfs-debian-%s-minbase-gcc-%s.tar.gz", suite, runtime.GOARCH))
	if _, err := os.Stat(tgz); err == nil {
		return tgz
	}
	ensurePackages(t, true)
	mirror := debianMirror(suite)
	dir := filepath.Join(tmp, "rootfs")
	start := time.Now()
	// gcc and libc6-dev, as golang:*-bookworm has them: scripts/build.sh
	// links the service with cgo, statically.
	must(t, runOpts{timeout: 20 * time.Minute}, "debootstrap", "--variant=minbase", "--include=gcc,libc6-dev", suite, dir, mirror)
	// Without apt's package lists and caches, docs, man pages and locales:
	// about 75 MB instead of 200. /dev is the engine's to fill.
	must(t, runOpts{timeout: 5 * time.Minute}, "bash", "-c",
		`set -o pipefail; tar --numeric-owner -C "$1" -c \
		  --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* --exclude=./run/* --exclude=./tmp/* \
		  --exclude=./var/cache/apt/* --exclude=./var/lib/apt/lists/* \
		  --exclude=./usr/share/doc/* --exclude=./usr/share/man/* --exclude=./usr/share/info/* --exclude=./usr/share/locale/* \
		  . | gzip -1 >"$2"`, "rootfs", dir, tgz+".tmp")
	if err := os.Rename(tgz+".tmp", tgz); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(dir)
	old, _ := filepath.Glob(filepath.Join(cache, "rootfs-debian-*.tar.gz"))
	for _, f := range old {
		if f != tgz {
			_ = os.Remove(f)
		}
	}
	t.Logf("debootstrapped Debian %s from %s in %s: %s", suite, mirror, time.Since(start).Round(time.Second), tgz)
	return tgz
}

// debianSuite is the host's Debian code name (bookworm on Debian 12), or
// bookworm elsewhere.
func debianSuite() string {
	b, err := os.ReadFile("/etc/os-release")
	if err == nil {
		var id, codename string
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok {
				codename = strings.Trim(v, `"`)
			}
			if v, ok := strings.CutPrefix(l, "ID="); ok {
				id = strings.Trim(v, `"`)
			}
		}
		if id == "debian" && codename != "" {
			return codename
		}
	}
	return "bookworm"
}

// debianMirror is the Debian archive apt uses on this host for suite
// ($SALESAGG_DEBIAN_MIRROR first), else deb.debian.org.
func debianMirror(suite string) string {
	if m := os.Getenv("SALESAGG_DEBIAN_MIRROR"); m != "" {
		return m
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range append([]string{"/etc/apt/sources.list"}, func() []string {
		l, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
		return l
	}()...) {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n") {
			fields := strings.Fields(l)
			// deb [options] URI suite components...
			if len(fields) >= 3 && fields[0] == "deb" {
				rest := fields[1:]
				if strings.HasPrefix(rest[0], "[") {
					for len(rest) > 0 && !strings.HasSuffix(rest[0], "]") {
						rest = rest[1:]
					}
					if len(rest) > 0 {
						rest = rest[1:]
					}
				}
				if len(rest) >= 2 && rest[1] == suite {
					return rest[0]
				}
			}
		}
	}
	for _, f := range append([]string{"/etc/apt/sources.list"}, files...) {
		b, _ := os.ReadFile(f)
		// deb822 stanzas: Types, URIs, Suites.
		for _, stanza := range strings.Split(string(b), "\n\n") {
			var uris, suites []string
			deb := false
			for _, l := range strings.Split(stanza, "\n") {
				k, v, ok := strings.Cut(l, ":")
				if !ok {
					continue
				}
				switch strings.TrimSpace(k) {
				case "Types":
					deb = slices.Contains(strings.Fields(v), "deb")
				case "URIs":
					uris = strings.Fields(v)
				case "Suites":
					suites = strings.Fields(v)
				}
			}
			if deb && len(uris) > 0 && slices.Contains(suites, suite) {
				return uris[0]
			}
		}
	}
	return "http://deb.debian.org/debian"
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// moduleProxy serves the host's module download cache over HTTP on
// 127.0.0.1, in the GOPROXY protocol (the cache is laid out as one), so that
// the image build's `go mod download` reads the modules this machine already
// has; what it lacks answers 404 and the build falls through to the next
// proxy in GOPROXY.
type moduleProxy struct {
	url           string
	served, found atomic.Int64
}

func startModuleProxy(t *testing.T) *moduleProxy {
	t.Helper()
	root := filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &moduleProxy{url: "http://" + ln.Addr().String()}
	files := http.FileServer(http.Dir(root))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.served.Add(1)
		clean := path.Clean("/" + r.URL.Path)
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(clean))); err != nil || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // never a directory listing
			return
		}
		p.found.Add(1)
		files.ServeHTTP(w, r)
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); wg.Wait() })
	return p
}
