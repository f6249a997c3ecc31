package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
)

func runService(args []string) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	setHelp(fs, "run [--config FILE] [--KEY VALUE ...]", "Runs the service. Each key can also be set in the YAML file (--config) or as SALESAGG_<KEY>\n"+
		"(dots as underscores, upper case); flags win over the environment, which wins over the file.", false)
	// Flag problems (an unknown flag, a flag without its value) and
	// configuration problems are reported together.
	cfg, err := config.LoadArgs(fs, args, os.Environ())
	if errors.Is(err, pflag.ErrHelp) {
		return err
	}
	if err != nil {
		return usageError{err}
	}
	log, format, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return usageError{err}
	}
	cfg.LogFormat = format
	recent := httpapi.NewRecentLog(100, nil) // the status page's last warnings and errors
	log = log.WithOptions(zap.WrapCore(recent.Tee))
	defer func() { _ = log.Sync() }()

	// Signals are caught from the first line on: a SIGTERM right after the
	// start-up line stops the service cleanly instead of killing it.
	// SIGHUP (the terminal closed, a supervisor's "reload") stops it the
	// same way: nothing of the configuration is reloaded in place, and a
	// restart on the same state dir restores nothing.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set && cfg.MemoryLimit() > 0 {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}

	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		return err
	}
	defer dir.Close()

	rt := stream.New(cfg, log, dir, stream.Knobs{CrashPoint: crashPointFromEnv(log), RestoreMemoryBytes: restoreMemoryFromEnv()})
	srv, err := listenHTTP(cfg, rt, log, recent)
	if err != nil {
		return err
	}
	rt.Advertise(srv.Addr())
	// The start-up line shows what the instance resolved: its static
	// membership id (derived from the state dir's process id when not
	// set) and the address it advertises (from the port it bound).
	resolved := cfg
	resolved.GroupInstanceID = rt.InstanceID()
	resolved.ApplicationServer = cfg.AdvertisedServer(srv.Addr())
	logStart(log, resolved, format)
	for _, n := range cfg.Notes {
		log.Info(n)
	}
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	if config.StoreCachesInHeap {
		log.Warn("Built without cgo: Pebble's block cache and memtables are Go heap, counted in the default memory limit; once the state outgrows the block cache an event costs about twice the CPU (scripts/build.sh builds with cgo where a C compiler is)",
			zap.Int64("memory.limit.bytes", cfg.MemoryLimit()))
	}
	if cfg.StateDirUnderTemp() {
		log.Warn("state.dir is under the OS temp dir: it may not survive a reboot, and a lost state dir means a full restore from the changelog",
			zap.String("state.dir", cfg.StateDir))
	}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve() }()

	// The shutdown line is written by the goroutine that saw the signal,
	// before Run is asked to stop: it is in the log however fast Run
	// returns. A start that failed (a missing input topic) closes runDone
	// and is not a shutdown that was asked for. After the first signal the
	// handler is removed, so a second one kills the process at once.
	runDone := make(chan struct{})
	go func() {
		select {
		case <-runDone:
		case <-sigs:
			log.Info("Shutdown requested: flushing, checkpointing and leaving the group", zap.Duration("grace", stream.GracePeriod))
			signal.Stop(sigs)
			stop()
		}
	}()
	runErr := rt.Run(ctx)
	close(runDone)

	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	httpErr := srv.Shutdown(shutCtx)
	if err := <-httpDone; err != nil {
		httpErr = errors.Join(httpErr, err)
	}
	return errors.Join(runErr, httpErr)
}

// logStart writes the start-up line with the effective configuration
// (log.format as chosen, the password redacted). In JSON every key is a
// field; in console, where one line of 30 keys is unreadable, a summary line
// of what an operator checks first, and every key at debug level.
func logStart(log *zap.Logger, cfg config.Config, format string) {
	all := cfg.Fields()
	fields := make([]zap.Field, 0, len(all))
	for _, k := range config.Keys() {
		if v, ok := all[k]; ok {
			fields = append(fields, zap.Any(k, v))
		}
	}
	if format == formatJSON {
		log.Info("Starting salesagg", fields...)
		return
	}
	log.Info(fmt.Sprintf("Starting salesagg %s: %s at %s, %s, state in %s, HTTP on %s as %s, group.instance.id %s (log.level debug lists every key)",
		cfg.ApplicationID, cfg.InputTopic, strings.Join(cfg.BootstrapServers, ","), cfg.ProcessingGuarantee,
		cfg.StateDir, cfg.HTTPAddr, cfg.ApplicationServer, cfg.GroupInstanceID))
	log.Debug("Effective configuration", fields...)
}
