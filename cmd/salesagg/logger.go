package main

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
)

// Log formats.
const (
	formatJSON    = "json"
	formatConsole = "console"
)

// stderrIsTerminal is whether standard error is a terminal; a variable for
// tests.
var stderrIsTerminal = func() bool { return term.IsTerminal(int(os.Stderr.Fd())) }

// resolveFormat returns the log format to use: format, or when it is empty
// console on a terminal and JSON otherwise.
func resolveFormat(format string) string {
	if format != "" {
		return format
	}
	if stderrIsTerminal() {
		return formatConsole
	}
	return formatJSON
}

// newLogger builds the process logger writing to standard error, and returns
// the format it chose (see resolveFormat).
//
// One convention for every line of every subcommand: time ISO 8601, level in
// capitals in console (coloured only on a terminal, so a file or a pipe gets
// no escape codes) and lower case in JSON, and durations in milliseconds, as
// the configuration's own *.ms keys and the duration_ms fields are.
func newLogger(level, format string) (*zap.Logger, string, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, "", err
	}
	format = resolveFormat(format)
	var cfg zap.Config
	if format == formatConsole {
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
		if stderrIsTerminal() {
			cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
	} else {
		cfg = zap.NewProductionConfig()
		cfg.Sampling = nil // operator-facing lines must never be dropped
	}
	cfg.Encoding = format
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.EncoderConfig.EncodeDuration = zapcore.MillisDurationEncoder
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = true
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	log, err := cfg.Build()
	if err != nil {
		return nil, "", err
	}
	return log, format, nil
}
