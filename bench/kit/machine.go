package kit

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// Machine is what a report says about the machine it ran on.
type Machine struct {
	Cores         int    `json:"cores"` // runtime.NumCPU
	MemTotalBytes int64  `json:"mem_total_bytes"`
	MemAvailBytes int64  `json:"mem_available_bytes_at_start"`
	CPUModel      string `json:"cpu_model,omitempty"`
	Kernel        string `json:"kernel,omitempty"`
	GOOS          string `json:"goos"`
	GOARCH        string `json:"goarch"`
	Hostname      string `json:"hostname,omitempty"`
	LoadAvgStart  string `json:"loadavg_start,omitempty"`
	LoadAvgEnd    string `json:"loadavg_end,omitempty"`
}

// Versions are the versions a report ran with.
type Versions struct {
	Go           string `json:"go"`
	Java         string `json:"java"`
	Kafka        string `json:"kafka_broker"`
	KafkaStreams string `json:"kafka_streams,omitempty"`
	GitCommit    string `json:"git_commit,omitempty"`
	GitDirty     bool   `json:"git_dirty"`
}

// DescribeMachine reads the machine's cores, memory, CPU model, kernel and
// host name (from /proc where Linux has them).
func DescribeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			f := strings.Fields(v)
			if len(f) == 0 {
				continue
			}
			n, _ := strconv.ParseInt(f[0], 10, 64)
			switch k {
			case "MemTotal":
				m.MemTotalBytes = n * 1024
			case "MemAvailable":
				m.MemAvailBytes = n * 1024
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if mm := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); mm != nil {
			m.CPUModel = strings.TrimSpace(string(mm[1]))
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Hostname, _ = os.Hostname()
	return m
}

// LoadAvg is the 1, 5 and 15 minute load averages ("" off Linux).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// JavaVersion is the first two lines of `java -version` as one ("" without
// java).
func JavaVersion() string {
	out, err := exec.Command("java", "-version").CombinedOutput()
	if err != nil {
		return ""
	}
	// e.g. openjdk version "17.0.15" 2025-04-15 / OpenJDK Runtime Environment (build 17.0.15+6-...)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	s := strings.TrimSpace(lines[0])
	if len(lines) > 1 {
		s += " (" + strings.TrimSpace(lines[1]) + ")"
	}
	return s
}

// GitState returns HEAD and whether the work tree differs from it, with
// read-only git commands (no index refresh is written).
func GitState(repo string) (string, bool) {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"--no-optional-locks", "-C", repo}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		return "", false
	}
	st, err := git("status", "--porcelain", "--untracked-files=no")
	return head, err == nil && st != ""
}

// ReferenceStreamsVersion reads the Kafka Streams version from the
// reference's runtime jars.
func ReferenceStreamsVersion(repo string) string {
	ms, _ := filepath.Glob(filepath.Join(repo, "bench", "kstreams-reference", "target", "lib", "kafka-streams-*.jar"))
	for _, m := range ms {
		v := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "kafka-streams-"), ".jar")
		if v != "" && v[0] >= '0' && v[0] <= '9' {
			return v
		}
	}
	return ""
}
