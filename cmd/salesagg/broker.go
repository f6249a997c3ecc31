package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/devbroker"
)

func runBroker(args []string) error {
	fs := pflag.NewFlagSet("broker", pflag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data/broker", "directory the broker persists to (empty: memory only)")
	listen := fs.String("listen", "127.0.0.1:9092", "host:port to listen on")
	level := fs.String("log.level", "info", "debug, info, warn or error")
	format := fs.String("log.format", "", "json or console (default: console on a terminal, json otherwise)")
	if err := config.ParseFlags(fs, args); err != nil {
		return usageError{err}
	}
	log, _, err := newLogger(*level, *format)
	if err != nil {
		return usageError{err}
	}
	defer func() { _ = log.Sync() }()
	b, err := devbroker.Start(devbroker.Options{DataDir: *dataDir, Listen: *listen, Log: log.Named("broker")})
	if err != nil {
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
