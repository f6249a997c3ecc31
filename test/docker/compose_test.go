//go:build docker

package docker

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/salesagg/salesagg/internal/sales"
	"github.com/salesagg/salesagg/test/harness"
	"github.com/salesagg/salesagg/test/port"
)

// changelog is the changelog topic of the default application id.
var changelog = sales.ChangelogTopic("sales-aggregator", sales.StoreName)

const (
	project    = "salesaggtest"
	stateVol   = "salesagg-state" // docker-compose.yml names its volumes
	kafkaVol   = "salesagg-kafka-data"
	partitions = 3
	serviceUID = "65532"
)

// TestComposeWalkthrough runs the README's compose walkthrough on a Docker
// engine of its own and checks what the README says it shows.
//
// Wall time on the 2-core CI machine (measured 2026-12-01, other work
// running alongside): cold, nothing cached, 10 min 0 s (Compose v2 built from
// the module proxy 4 min 12 s, debootstrap 52 s, builder image 47 s, project
// image 3 min 9 s, Kafka and the walkthrough 40 s), plus ~25 s of apt-get
// install docker.io on a machine without it; warm (~/.cache/salesagg/docker
// filled), 4 min 48 s to 5 min 47 s, nearly all of it the image build (the
// service compiled from scratch in the builder: ~2.5 min, each Dockerfile step
// a vfs copy of the builder image).
func TestComposeWalkthrough(t *testing.T) {
	r := begin(t)
	repo, cache, tmp, phase := r.repo, r.cache, r.tmp, r.phase
	ensurePackages(t, false)
	compose := composeBinary(t, cache, tmp)
	phase("packages and Compose")
	e := startDockerd(t, filepath.Join(tmp, "engine"))
	phase("dockerd")
	debian, golang := builderImages(t, e, cache, tmp)
	phase("builder image")
	image := buildImage(t, e, repo, golang)
	phase("project image")
	checkImage(t, e, image)
	saveProjectImage(t, e, cache, savedImagePath(cache, projectImageKey(t, repo)), image)
	phase("project image saved")

	bootstrap := startKafka(t, repo, filepath.Join(tmp, "kafka"))
	phase("Kafka broker")
	kafkaPort := bootstrap[strings.LastIndex(bootstrap, ":")+1:]
	httpAddr, err := port.Free()
	if err != nil {
		t.Fatal(err)
	}
	httpPort := httpAddr[strings.LastIndex(httpAddr, ":")+1:]

	c := &composeRun{t: t, e: e, bin: compose, dir: repo, api: harness.NewAPI(httpAddr)}
	c.env = append(slices.Clone(e.env),
		"COMPOSE_FILE=docker-compose.yml:test/docker/docker-compose.test.yml",
		"COMPOSE_PROJECT_NAME="+project, "COMPOSE_ANSI=never", "COMPOSE_PROFILES=",
		"SALESAGG_TEST_IMAGE="+image, "SALESAGG_TEST_STANDIN_IMAGE="+debian,
		"SALESAGG_TEST_BOOTSTRAP="+bootstrap, "SALESAGG_TEST_KAFKA_PORT="+kafkaPort,
		"SALESAGG_TEST_HTTP_PORT="+httpPort)
	t.Cleanup(func() { c.down() })
	t.Logf("compose: %s", strings.TrimSpace(c.dc("version").stdout))

	// 1. docker-compose up -d: Kafka (here the stand-in) healthy first, then
	// the service, healthy once its tasks are restored (nothing to restore).
	c.dc("up", "-d")
	first := c.waitHealthy()
	phase("first up, healthy")
	c.checkContainer(first)
	logs := c.restoreLines()
	c.expectRestored(logs, map[int32]int64{0: 0, 1: 0, 2: 0}, true)

	// 2. The sample events, with the image's own producer (the README's
	// kafka-console-producer.sh runs in the apache/kafka container, which
	// the override replaces).
	events, err := os.Open(filepath.Join(repo, "sample_events.txt"))
	if err != nil {
		t.Fatal(err)
	}
	res := must(t, runOpts{dir: repo, env: c.env, stdin: events, timeout: 2 * time.Minute},
		c.bin, "run", "--rm", "-T", "salesagg", "produce", "--file", "-")
	events.Close()
	if !strings.Contains(res.stderr+res.stdout, "sent 100 records to sales-events-v1") {
		t.Fatalf("produce said:\n%s%s", res.stdout, res.stderr)
	}
	harness.WaitFor(t, time.Minute, "the sample totals over HTTP", c.checkTotals)
	phase("produced, totals")

	// 3. docker-compose stop && docker-compose rm -f && docker-compose up -d:
	// a new container on the same volume restores 0 records per task.
	volBefore := c.volumeCreated(stateVol)
	c.dc("stop")
	c.dc("rm", "-f")
	if ids := strings.TrimSpace(c.docker("ps", "-aq").stdout); ids != "" {
		t.Fatalf("containers left after docker-compose rm -f: %s", ids)
	}
	c.dc("up", "-d")
	second := c.waitHealthy()
	if second.ID == first.ID {
		t.Fatalf("docker-compose up -d after rm -f kept container %s", first.ID)
	}
	if got := c.volumeCreated(stateVol); got != volBefore {
		t.Fatalf("volume %s was recreated (%s, before %s)", stateVol, got, volBefore)
	}
	c.checkContainer(second)
	logs = c.restoreLines()
	c.expectRestored(logs, map[int32]int64{0: 0, 1: 0, 2: 0}, false)
	harness.WaitFor(t, 30*time.Second, "the same totals after stop, rm, up", c.checkTotals)
	phase("stop, rm, up: 0 restored")

	// 4. The state removed: docker-compose stop salesagg && docker-compose rm
	// -f salesagg && docker volume rm salesagg-state && docker-compose up -d.
	// Each task finds no checkpoint and restores its whole changelog partition.
	c.dc("stop", "salesagg")
	counts := changelogCounts(t, bootstrap, changelog)
	c.dc("rm", "-f", "salesagg")
	c.docker("volume", "rm", stateVol)
	c.dc("up", "-d")
	third := c.waitHealthy()
	c.checkContainer(third)
	logs = c.restoreLines()
	c.expectRestored(logs, counts, true)
	harness.WaitFor(t, 30*time.Second, "the same totals after the full restore", c.checkTotals)
	phase("state removed: full restore")

	// 5. docker-compose down -v removes the containers and both volumes;
	// then the image goes. The engine, its data root and the broker go in
	// the cleanups; the cached builder images stay.
	c.down()
	if ids := strings.TrimSpace(c.docker("ps", "-aq").stdout); ids != "" {
		t.Errorf("containers left after docker-compose down -v: %s", ids)
	}
	vols := c.docker("volume", "ls", "-q").stdout
	for _, v := range []string{stateVol, kafkaVol} {
		if slices.Contains(strings.Fields(vols), v) {
			t.Errorf("volume %s left after docker-compose down -v", v)
		}
	}
	c.docker("rmi", image)
	if out, err := run(t, runOpts{env: e.env, quiet: true}, "docker", "image", "inspect", image); err == nil {
		t.Errorf("image %s still there after docker rmi: %s", image, out.stdout)
	}
	phase("down -v, rmi")
}

// phaseTimer logs the wall time of each phase.
func phaseTimer(t *testing.T) func(string) {
	last := time.Now()
	return func(name string) {
		t.Logf("== %s: %s", name, time.Since(last).Round(100*time.Millisecond))
		last = time.Now()
	}
}

// startWatchdog starts a shell in its own session that, should this process
// die without its cleanups (the -timeout alarm, a signal), stops the dockerd
// of this run, takes the broker down and removes tmp.
func startWatchdog(t *testing.T, tmp, repo string) {
	t.Helper()
	script := `while kill -0 "$1" 2>/dev/null; do sleep 1; done
p=$(cat "$2/engine/dockerd.pid" 2>/dev/null)
if [ -n "$p" ] && grep -qF "$2" "/proc/$p/cmdline" 2>/dev/null; then
  kill -TERM "$p"; for i in $(seq 60); do kill -0 "$p" 2>/dev/null || break; sleep 1; done; kill -KILL "$p" 2>/dev/null
fi
KAFKA_DIR="$2/kafka" "$3" down
rm -rf --one-file-system "$2"`
	cmd := exec.Command("bash", "-c", script, "salesagg-docker-watchdog", strconv.Itoa(os.Getpid()), tmp,
		filepath.Join(repo, "test", "kafka", "kafka.sh"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// buildImage builds the project's image with the Dockerfile as a user would,
// but from the local builder image, on the host's network, with the module
// download cache of this machine served as the first GOPROXY.
func buildImage(t *testing.T, e *engine, repo, golang string) string {
	t.Helper()
	// Every module of go.mod in the host's cache: the build reads them from it.
	must(t, runOpts{dir: repo, timeout: 10 * time.Minute}, "go", "mod", "download")
	proxy := startModuleProxy(t)
	goproxy := proxy.url
	if p := goEnv(t, "GOPROXY"); p != "" && p != "off" {
		goproxy += "," + p
	}
	image := fmt.Sprintf("%s/salesagg:%d", imagePrefix, time.Now().UnixNano())
	t.Cleanup(func() { _, _ = run(t, runOpts{env: e.env, quiet: true}, "docker", "rmi", "-f", image) })
	res, err := run(t, runOpts{dir: repo, env: e.env, timeout: 20 * time.Minute}, "docker", "build", "--network", "host",
		"--build-arg", "GO_IMAGE="+golang, "--build-arg", "GOPROXY="+goproxy, "-t", image, ".")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(e.root, "build.log"), []byte(res.stdout+res.stderr), 0o644)
	t.Logf("built %s; the module proxy answered %d of %d requests from the host's cache", image, proxy.found.Load(), proxy.served.Load())
	return image
}

// checkImage checks the image's configuration and its file tree: non-root,
// the exec-form healthcheck, the volume, and nothing but the binary, the CA
// bundle, passwd/group and the volume's mount point (no shell).
func checkImage(t *testing.T, e *engine, image string) {
	t.Helper()
	var cfg []struct {
		Config struct {
			User        string
			Entrypoint  []string
			Cmd         []string
			Env         []string
			Volumes     map[string]struct{}
			Healthcheck struct{ Test []string }
		}
	}
	if err := json.Unmarshal([]byte(e.docker(t, "image", "inspect", image).stdout), &cfg); err != nil || len(cfg) != 1 {
		t.Fatalf("docker image inspect %s: %v", image, err)
	}
	c := cfg[0].Config
	if c.User != serviceUID+":"+serviceUID {
		t.Errorf("image user %q, want %s:%s", c.User, serviceUID, serviceUID)
	}
	if want := []string{"CMD", "/usr/local/bin/salesagg", "health"}; len(c.Healthcheck.Test) < 3 || !slices.Equal(c.Healthcheck.Test[:3], want) {
		t.Errorf("HEALTHCHECK %q, want exec form %q...", c.Healthcheck.Test, want)
	}
	if _, ok := c.Volumes["/shared-volume"]; !ok || !slices.Contains(c.Env, "SALESAGG_STATE_DIR=/shared-volume/state_store") {
		t.Errorf("volumes %v, env %v: want /shared-volume and SALESAGG_STATE_DIR=/shared-volume/state_store", c.Volumes, c.Env)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/salesagg"}) || !slices.Equal(c.Cmd, []string{"run"}) {
		t.Errorf("entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}

	id := strings.TrimSpace(e.docker(t, "create", image).stdout)
	defer e.docker(t, "rm", id)
	cmd := exec.Command("docker", "export", id)
	cmd.Env = append(os.Environ(), e.env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = h
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	// What the engine adds to every container (.dockerenv, /dev, /proc,
	// /sys, /etc/hosts, /etc/hostname, /etc/resolv.conf, /etc/mtab) aside.
	var unexpected []string
	for name, h := range files {
		switch {
		case name == "usr/local/bin/salesagg":
			if h.Uid != 0 || h.Mode&0o022 != 0 || h.Mode&0o111 == 0 {
				t.Errorf("%s: uid %d mode %o, want root-owned, executable, not writable by others", name, h.Uid, h.Mode)
			}
		case name == "shared-volume" || name == "shared-volume/state_store":
			if strconv.Itoa(h.Uid) != serviceUID || strconv.Itoa(h.Gid) != serviceUID {
				t.Errorf("%s owned by %d:%d, want %s", name, h.Uid, h.Gid, serviceUID)
			}
		case slices.Contains([]string{"etc/ssl/certs/ca-certificates.crt", "etc/passwd", "etc/group", ".dockerenv",
			"etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab"}, name):
		case slices.Contains([]string{"etc", "etc/ssl", "etc/ssl/certs", "usr", "usr/local", "usr/local/bin", "dev", "proc", "sys"}, name):
		case strings.HasPrefix(name, "dev/"):
		default:
			unexpected = append(unexpected, name)
		}
	}
	if len(unexpected) > 0 {
		slices.Sort(unexpected)
		t.Errorf("unexpected files in the image: %v", unexpected)
	}
	for _, want := range []string{"usr/local/bin/salesagg", "etc/ssl/certs/ca-certificates.crt", "shared-volume/state_store"} {
		if files[want] == nil {
			t.Errorf("%s missing from the image", want)
		}
	}
	if files["bin/sh"] != nil {
		t.Errorf("the image has a shell")
	}
	// The builder has a C compiler: the binary is the cgo build, linked
	// statically (Pebble's caches outside the Go heap), and runs on an image
	// without libc.
	version := e.docker(t, "run", "--rm", "--network", "host", image, "version").stdout
	if !strings.Contains(version, "\n  cgo:      on (") {
		t.Errorf("salesagg version in the image says\n%s\nwant cgo on (scripts/build.sh with the builder's gcc)", version)
	}
	t.Logf("image %s: user %s, %d entries, no shell, cgo on", image, c.User, len(files))
}

// startKafka starts the project's Apache Kafka test broker with KAFKA_DIR
// dir and returns its address; the broker goes down in the cleanup.
func startKafka(t *testing.T, repo, dir string) string {
	t.Helper()
	k := harness.NewKafka(repo, dir)
	t.Cleanup(func() {
		if out, err := k.Run(2*time.Minute, "down"); err != nil {
			t.Errorf("kafka.sh down: %v\n%s", err, out)
		}
	})
	addr, err := k.Up(5 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// composeRun runs Compose for the project, with COMPOSE_FILE naming
// docker-compose.yml and the override, so that each command reads as in the
// README.
type composeRun struct {
	t    *testing.T
	e    *engine
	bin  string
	dir  string
	env  []string
	api  *harness.API // the service's HTTP API
	gone bool
}

func (c *composeRun) dc(args ...string) cmdResult {
	c.t.Helper()
	return must(c.t, runOpts{dir: c.dir, env: c.env, timeout: 5 * time.Minute}, c.bin, args...)
}

func (c *composeRun) docker(args ...string) cmdResult {
	c.t.Helper()
	return must(c.t, runOpts{dir: c.dir, env: c.env}, "docker", args...)
}

// down is docker-compose down -v, once; on a failed test it first logs the
// service's output.
func (c *composeRun) down() {
	if c.gone {
		return
	}
	c.gone = true
	if c.t.Failed() {
		if res, err := run(c.t, runOpts{dir: c.dir, env: c.env, quiet: true}, c.bin, "logs", "--no-color", "--tail", "60"); err == nil {
			c.t.Logf("docker-compose logs (last 60 lines per service):\n%s", res.stdout)
		}
		c.t.Logf("dockerd log (tail):\n%s", c.e.logTail())
	}
	if _, err := run(c.t, runOpts{dir: c.dir, env: c.env, timeout: 3 * time.Minute}, c.bin, "down", "-v", "--timeout", "40"); err != nil {
		c.t.Error(err)
	}
}

type container struct {
	ID     string
	Config struct {
		User string
	}
	HostConfig struct {
		ReadonlyRootfs bool
		NetworkMode    string
		PortBindings   map[string]any
	}
	State struct {
		Status   string
		Pid      int
		ExitCode int
		Health   *struct {
			Status string
			Log    []struct {
				ExitCode int
				Output   string
			}
		}
	}
	Mounts []struct {
		Type, Name, Destination string
		RW                      bool
	}
}

func (c *composeRun) inspect(id string) (container, error) {
	res, err := run(c.t, runOpts{env: c.env, quiet: true, timeout: 30 * time.Second}, "docker", "inspect", id)
	if err != nil {
		return container{}, err
	}
	var out []container
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil || len(out) != 1 {
		return container{}, fmt.Errorf("docker inspect %s: %v", id, err)
	}
	return out[0], nil
}

// waitHealthy waits until the salesagg container's healthcheck (salesagg
// health, exec form) reports healthy, and returns the container.
func (c *composeRun) waitHealthy() container {
	c.t.Helper()
	id := strings.TrimSpace(c.dc("ps", "-q", "salesagg").stdout)
	if id == "" {
		c.t.Fatal("docker-compose ps -q salesagg: no container")
	}
	var got container
	took := harness.WaitFor(c.t, 3*time.Minute, "the salesagg container to be healthy", func() error {
		ct, err := c.inspect(id)
		if err != nil {
			return err
		}
		got = ct
		if ct.State.Status == "exited" || ct.State.Status == "dead" {
			return fmt.Errorf("%w: the container %s (exit code %d)", harness.ErrGiveUp, ct.State.Status, ct.State.ExitCode)
		}
		if ct.State.Health == nil {
			return fmt.Errorf("%w: the container has no healthcheck", harness.ErrGiveUp)
		}
		if ct.State.Health.Status != "healthy" {
			last := "no probe yet"
			if n := len(ct.State.Health.Log); n > 0 {
				l := ct.State.Health.Log[n-1]
				last = fmt.Sprintf("exit %d: %s", l.ExitCode, strings.TrimSpace(l.Output))
			}
			return fmt.Errorf("health %s (last probe %s)", ct.State.Health.Status, last)
		}
		return nil
	})
	last := got.State.Health.Log[len(got.State.Health.Log)-1]
	if last.ExitCode != 0 || !strings.Contains(last.Output, "/readyz: 200 OK") {
		c.t.Fatalf("healthy, but the last probe said exit %d %q", last.ExitCode, last.Output)
	}
	c.t.Logf("container %.12s healthy after %s (probe: %s)", id, took.Round(100*time.Millisecond), strings.TrimSpace(last.Output))
	return got
}

// checkContainer checks that the service runs as uid 65532 on a read-only
// root file system with the named volume at /shared-volume: from docker
// inspect, and from the host's /proc for the container's process.
func (c *composeRun) checkContainer(ct container) {
	c.t.Helper()
	t := c.t
	if ct.Config.User != serviceUID+":"+serviceUID {
		t.Errorf("Config.User %q, want %s:%s", ct.Config.User, serviceUID, serviceUID)
	}
	if !ct.HostConfig.ReadonlyRootfs {
		t.Errorf("HostConfig.ReadonlyRootfs is false")
	}
	if ct.HostConfig.NetworkMode != "host" || len(ct.HostConfig.PortBindings) != 0 {
		t.Errorf("network mode %q, port bindings %v: want host, none", ct.HostConfig.NetworkMode, ct.HostConfig.PortBindings)
	}
	vol := false
	for _, m := range ct.Mounts {
		if m.Destination == "/shared-volume" && m.Type == "volume" && m.Name == stateVol && m.RW {
			vol = true
		}
	}
	if !vol {
		t.Errorf("mounts %+v: want volume %s read-write at /shared-volume", ct.Mounts, stateVol)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ct.State.Pid))
	if err != nil {
		t.Fatalf("the container's process %d: %v", ct.State.Pid, err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "Uid" || k == "Gid") {
			for _, id := range strings.Fields(v) {
				if id != serviceUID {
					t.Errorf("process %d: %s %s, want %s for all", ct.State.Pid, k, strings.TrimSpace(v), serviceUID)
					break
				}
			}
		}
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ct.State.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var rootOpts, volOpts string
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 {
			switch f[4] {
			case "/":
				rootOpts = f[5]
			case "/shared-volume":
				volOpts = f[5]
			}
		}
	}
	if !slices.Contains(strings.Split(rootOpts, ","), "ro") {
		t.Errorf("the container's / is mounted %q, want ro", rootOpts)
	}
	if !slices.Contains(strings.Split(volOpts, ","), "rw") {
		t.Errorf("the container's /shared-volume is mounted %q, want rw", volOpts)
	}
	// The probe without a shell: docker exec of the binary itself.
	if _, err := run(t, runOpts{env: c.env, quiet: true}, "docker", "exec", ct.ID, "/usr/local/bin/salesagg", "health"); err != nil {
		t.Errorf("salesagg health in the container: %v", err)
	}
	res, err := run(t, runOpts{env: c.env, quiet: true}, "docker", "exec", ct.ID, "/usr/local/bin/salesagg", "health", "--path", "/nope")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(res.stderr, "404 Not Found") {
		t.Errorf("salesagg health --path /nope in the container: %v, stderr %q; want exit 1 and 404", err, res.stderr)
	}
	if !t.Failed() {
		t.Logf("container %.12s: pid %d runs as uid/gid %s, / mounted %s, /shared-volume (%s) %s", ct.ID, ct.State.Pid, serviceUID, rootOpts, stateVol, volOpts)
	}
}

// logLine is one JSON log line of the service.
type logLine struct {
	Msg     string `json:"msg"`
	Records *int64 `json:"records"`
}

var restoredRe = regexp.MustCompile(`^Finished restoring changelog (\S+)-(\d+) to store (\S+) with a total number of (\d+) records$`)

// restoreLines reads docker-compose logs salesagg (the container's whole
// output: the container is new) and returns the lines the README greps for:
// 'total number of', 'did not find checkpoint' and 'Restoration took'.
//
// The container's logs reach docker a moment after they are written: it
// reads them until the "Restoration took" line is there (logged after the
// tasks run, so possibly after the container turned healthy).
func (c *composeRun) restoreLines() []string {
	c.t.Helper()
	var out []string
	harness.WaitFor(c.t, 30*time.Second, "the 'Restoration took' line in docker-compose logs", func() error {
		out = c.readRestoreLines()
		for _, l := range out {
			if strings.HasPrefix(l, "Restoration took") {
				return nil
			}
		}
		return errors.New("not logged yet")
	})
	c.t.Logf("docker-compose logs salesagg | grep 'total number of':\n  %s", strings.Join(slices.DeleteFunc(slices.Clone(out), func(s string) bool {
		return !strings.Contains(s, "total number of")
	}), "\n  "))
	return out
}

func (c *composeRun) readRestoreLines() []string {
	c.t.Helper()
	res := c.dc("logs", "--no-color", "salesagg")
	var out []string
	for _, l := range strings.Split(res.stdout, "\n") {
		i := strings.Index(l, "{")
		if i < 0 {
			continue
		}
		var ll logLine
		if json.Unmarshal([]byte(l[i:]), &ll) != nil {
			continue
		}
		if strings.Contains(ll.Msg, "total number of") || strings.Contains(ll.Msg, "did not find checkpoint") ||
			strings.HasPrefix(ll.Msg, "Restoration took") {
			out = append(out, ll.Msg)
		}
	}
	return out
}

// expectRestored checks one "Finished restoring ... total number of N
// records" line per partition with the wanted N, a "Restoration took" line,
// and, when noCheckpoint, a "did not find checkpoint offset" line per task
// (none otherwise).
func (c *composeRun) expectRestored(lines []string, want map[int32]int64, noCheckpoint bool) {
	c.t.Helper()
	got := map[int32]int64{}
	took, missing := 0, 0
	for _, l := range lines {
		if m := restoredRe.FindStringSubmatch(l); m != nil {
			p, _ := strconv.Atoi(m[2])
			n, _ := strconv.ParseInt(m[4], 10, 64)
			if m[1] != changelog || m[3] != "PRODUCT_AGGREGATED_SALES" {
				c.t.Errorf("restore line for %s / %s: %q", m[1], m[3], l)
			}
			if _, dup := got[int32(p)]; dup {
				c.t.Errorf("partition %d restored twice: %q", p, l)
			}
			got[int32(p)] = n
		}
		if strings.HasPrefix(l, "Restoration took") && strings.Contains(l, "for all tasks [0_0, 0_1, 0_2]") {
			took++
		}
		if strings.Contains(l, "did not find checkpoint offset") {
			missing++
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		c.t.Errorf("restored records per partition %v, want %v", got, want)
	}
	if took != 1 {
		c.t.Errorf("%d 'Restoration took ... for all tasks [0_0, 0_1, 0_2]' lines, want 1", took)
	}
	if wantMissing := map[bool]int{true: partitions, false: 0}[noCheckpoint]; missing != wantMissing {
		c.t.Errorf("%d 'did not find checkpoint offset' lines, want %d", missing, wantMissing)
	}
}

// checkTotals asks the service for each product over HTTP, as a user would.
func (c *composeRun) checkTotals() error { return c.api.CheckTotals(harness.SampleTotals) }

func (c *composeRun) volumeCreated(name string) string {
	c.t.Helper()
	return strings.TrimSpace(c.docker("volume", "inspect", "--format", "{{.CreatedAt}}", name).stdout)
}

// changelogCounts reads the changelog to its end (read_committed, as the
// restore does) and returns the committed records of each partition.
func changelogCounts(t *testing.T, bootstrap, topic string) map[int32]int64 {
	t.Helper()
	c, err := harness.ReadTopic(bootstrap, topic, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int32]int64{}
	for p := range c.End {
		counts[p] = 0
	}
	for _, r := range c.Records {
		counts[r.Partition]++
	}
	if len(counts) != partitions {
		t.Fatalf("changelog %s has partitions %v, want %d", topic, counts, partitions)
	}
	t.Logf("changelog %s: committed records per partition %v", topic, counts)
	return counts
}

// checkNothingLeft fails the test if a process of this run's engine (dockerd,
// containerd, a shim) is still running; it runs after the engine's cleanup.
func checkNothingLeft(t *testing.T, tmp string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), tmp+"/engine") {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "salesagg-docker-watchdog") {
			continue
		}
		t.Errorf("left running: %s: %s", filepath.Base(filepath.Dir(p)), cmd)
	}
}
