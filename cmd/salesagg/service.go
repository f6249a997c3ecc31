package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
	"github.com/salesagg/salesagg/internal/state"
	"github.com/salesagg/salesagg/internal/stream"
)

// crashPointEnv names a commit-cycle point at which the process kills itself
// with SIGKILL, for crash tests: "POINT" or "POINT:N" (the Nth time).
const crashPointEnv = "SALESAGGTEST_CRASH_POINT"

func runService(args []string) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	cfg, err := config.Load(fs, os.Environ())
	if err != nil {
		return usageError{err}
	}
	log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return usageError{err}
	}
	defer func() { _ = log.Sync() }()

	fields := []zap.Field{}
	for _, k := range config.Keys() {
		fields = append(fields, zap.Any(k, cfg.Fields()[k]))
	}
	log.Info("Starting salesagg", fields...)
	if cfg.StateDirUnderTemp() {
		log.Warn("state.dir is under the OS temp dir: it may not survive a reboot, and a lost state dir means a full restore from the changelog",
			zap.String("state.dir", cfg.StateDir))
	}

	dir, err := state.OpenDir(cfg.StateDir, cfg.ApplicationID)
	if err != nil {
		return err
	}
	defer dir.Close()

	rt := stream.New(cfg, log, dir, stream.Knobs{CrashPoint: crashPointFromEnv(log)})
	srv, err := httpapi.Listen(cfg.HTTPAddr, rt, log)
	if err != nil {
		return err
	}
	rt.Advertise(srv.Addr())
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		log.Info("Shutdown requested: flushing, checkpointing and leaving the group", zap.Duration("grace", stream.GracePeriod))
		stop() // a second signal kills the process at once
	}()
	runErr := rt.Run(ctx)

	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	httpErr := srv.Shutdown(shutCtx)
	if err := <-httpDone; err != nil {
		httpErr = errors.Join(httpErr, err)
	}
	return errors.Join(runErr, httpErr)
}

func crashPointFromEnv(log *zap.Logger) func(string) {
	spec := os.Getenv(crashPointEnv)
	if spec == "" {
		return nil
	}
	point, nth, _ := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if err != nil || n < 1 {
		n = 1
	}
	var hits atomic.Int64
	log.Warn("Crash point armed (testing only)", zap.String("point", point), zap.Int("nth", n))
	return func(p string) {
		if p == point && hits.Add(1) == int64(n) {
			_ = log.Sync()
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal arrives; nothing after this point runs
		}
	}
}
