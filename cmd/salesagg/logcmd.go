package main

import (
	"errors"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// runLog implements "salesagg log", a helper for scripts (scripts/dev.sh)
// whose own lines must be in the service's format:
//
//	salesagg log [--log.format F] [--level L] [--logger NAME] MESSAGE [KEY=VALUE ...]
//
// writes one log line to standard error, as the service would (JSON, or
// console on a terminal; see newLogger), each KEY=VALUE as a string field.
func runLog(args []string) error {
	fs := pflag.NewFlagSet("log", pflag.ContinueOnError)
	fs.SetInterspersed(false) // the message and its fields may hold anything
	format := fs.String("log.format", "", "json or console (default: console on a terminal, json otherwise)")
	level := fs.String("level", "info", "debug, info, warn or error")
	name := fs.String("logger", "", "logger name")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() == 0 {
		return usageError{errors.New("usage: salesagg log [--log.format F] [--level L] [--logger NAME] MESSAGE [KEY=VALUE ...]")}
	}
	lvl, err := zapcore.ParseLevel(*level)
	if err != nil {
		return usageError{err}
	}
	log, _, err := newLogger("debug", *format)
	if err != nil {
		return usageError{err}
	}
	defer func() { _ = log.Sync() }()
	if *name != "" {
		log = log.Named(*name)
	}
	var fields []zap.Field
	for _, kv := range fs.Args()[1:] {
		k, v, _ := strings.Cut(kv, "=")
		fields = append(fields, zap.String(k, v))
	}
	// No caller: it would name this file, not the script.
	log.WithOptions(zap.WithCaller(false)).Log(lvl, fs.Arg(0), fields...)
	return nil
}
