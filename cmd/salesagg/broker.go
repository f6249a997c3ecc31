package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/devbroker"
)

// runBroker runs the embedded dev broker until SIGTERM or SIGINT. Its
// standard output gets one line, "broker listening on ADDR", once the
// listener is bound: scripts/dev.sh waits for that line (not for the port to
// answer, which another process holding the port would do too). When the
// address is taken it fails at once naming the address and, when /proc says,
// the process that holds it.
func runBroker(args []string) error {
	fs := pflag.NewFlagSet("broker", pflag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data/broker", "directory the broker persists to (empty: memory only)")
	listen := fs.String("listen", "127.0.0.1:9092", "host:port to listen on")
	level := fs.String("log.level", "info", "debug, info, warn or error")
	format := fs.String("log.format", "", "json or console (default: console on a terminal, json otherwise)")
	def := config.Default()
	topics := fs.StringSlice("topics", []string{def.InputTopic}, "topics created at start when missing, comma separated (empty: none): salesagg run creates no input topic unless asked (topics.input.create)")
	partitions := fs.Int32("partitions", def.TopicsPartitions, "partitions of each of --topics")
	setHelp(fs, "broker [--data-dir DIR] [--listen ADDR] [--topics T,...]",
		"Runs the embedded dev broker (franz-go's kfake, persisting to --data-dir) until SIGTERM or SIGINT,\n"+
			"with the input topic created; for a laptop without Kafka.", false)
	if err := config.ParseFlags(fs, args); errors.Is(err, pflag.ErrHelp) {
		return err
	} else if err != nil {
		return usageError{err}
	}
	log, _, err := newLogger(*level, *format)
	if err != nil {
		return usageError{err}
	}
	defer func() { _ = log.Sync() }()
	b, err := devbroker.Start(devbroker.Options{DataDir: *dataDir, Listen: *listen, Log: log.Named("broker")})
	if err != nil {
		return explainBind(*listen, err, fmt.Sprintf("stop it, or give the dev broker another address (--listen; make run: BROKER_LISTEN=host:port), or use that broker on purpose (make run: BROKER=%s)", *listen))
	}
	if err := seedTopics(b.Addr(), *topics, *partitions, log); err != nil {
		b.Close()
		return err
	}
	log.Info("Embedded dev broker started", zap.String("addr", b.Addr()), zap.String("data_dir", *dataDir))
	fmt.Fprintf(os.Stdout, "broker listening on %s\n", b.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	log.Info("Stopping embedded dev broker")
	b.Close()
	log.Info("Embedded dev broker stopped")
	return nil
}

// seedTopics creates those of topics the broker at addr lacks, so that a
// fresh dev broker has the service's input topic: the service refuses to
// start on a missing one (and creates it only when told to).
func seedTopics(addr string, topics []string, partitions int32, log *zap.Logger) error {
	if len(topics) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	listed, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return fmt.Errorf("listing the dev broker's topics: %w", err)
	}
	for _, t := range topics {
		if d, ok := listed[t]; ok && d.Err == nil {
			continue
		}
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, t)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("creating topic %s on the dev broker: %w", t, err)
		}
		log.Info("Created topic", zap.String("topic", t), zap.Int32("partitions", partitions))
	}
	return nil
}

// explainBind returns err, and when it is "address already in use" an error
// naming the address, the process listening on its port and what to do
// (advice): the dev broker's --listen and the service's http.addr say it
// the same way.
func explainBind(addr string, err error, advice string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	holder := "another process (not one of this user's, or /proc is not readable)"
	if _, p, splitErr := net.SplitHostPort(addr); splitErr == nil {
		if port, convErr := strconv.Atoi(p); convErr == nil {
			if h := portHolder(port); h != "" {
				holder = h
			}
		}
	}
	return fmt.Errorf("listening on %s: address already in use, held by %s; %s", addr, holder, advice)
}

// portHolder names the process listening on TCP port (any local address)
// as "pid N (command line)", from /proc/net/tcp{,6} (the socket's inode)
// and /proc/*/fd (who has it open). It returns "" when nothing listens
// there; "a process of uid U" when the socket's owner is not readable.
func portHolder(port int) string {
	inodes := map[string]string{} // socket inode -> uid
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listeningInodes(f, port, inodes)
	}
	if len(inodes) == 0 {
		return ""
	}
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range pids {
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if _, ok := inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")]; ok {
				return "pid " + filepath.Base(dir) + " (" + commandLine(dir) + ")"
			}
		}
	}
	for _, uid := range inodes {
		return "a process of uid " + uid
	}
	return ""
}

// listeningInodes adds to inodes the inode and uid of each socket of the
// /proc/net/tcp-format file name listening on port.
func listeningInodes(name string, port int, inodes map[string]string) {
	f, err := os.Open(name)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // 0A: TCP_LISTEN
			continue
		}
		i := strings.LastIndexByte(fields[1], ':')
		if p, err := strconv.ParseUint(fields[1][i+1:], 16, 16); err != nil || int(p) != port {
			continue
		}
		inodes[fields[9]] = fields[7]
	}
}

// commandLine returns the command line of the process whose /proc dir is
// dir, its name when that is unreadable.
func commandLine(dir string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil && len(b) > 0 {
		s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		return s
	}
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "?"
}
