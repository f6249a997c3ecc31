package k8s

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/salesagg/salesagg/internal/config"
)

// EffectiveConfig loads salesagg's configuration the way `salesagg run`
// does in pod p: its arguments after "run" as flags (a path in a mount, such
// as --config's, read from the mount's local directory) and p's environment
// as it is (paths in it are left as the container sees them).
func EffectiveConfig(p *Pod) (config.Config, error) {
	args := append([]string(nil), p.Command...)
	if !p.EntrypointFromImage {
		if len(args) == 0 || filepath.Base(args[0]) != "salesagg" {
			return config.Config{}, fmt.Errorf("command %q does not run salesagg", args)
		}
		args = args[1:]
	}
	if len(args) == 0 || args[0] != "run" {
		return config.Config{}, fmt.Errorf("arguments %q: want the subcommand run first", args)
	}
	local := &Pod{Mounts: p.Mounts, Command: args[1:]}
	local.LocalizePaths()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	if err := fs.Parse(local.Command); err != nil {
		return config.Config{}, fmt.Errorf("arguments %q: %w", args, err)
	}
	return config.Load(fs, p.Environ())
}

// ConfigEnvNames returns the environment variable of every config key.
func ConfigEnvNames() map[string]string {
	out := map[string]string{}
	for _, k := range config.Keys() {
		out[config.EnvName(k)] = k
	}
	return out
}

// ShutdownGrace returns how long salesagg may take to stop after SIGTERM:
// stream.GracePeriod (read from internal/stream/runtime.go, so that this
// module does not build the service's runtime) plus the 5 s the HTTP server
// is given after it (cmd/salesagg/service.go).
func ShutdownGrace(root string) (time.Duration, error) {
	path := filepath.Join(root, "internal", "stream", "runtime.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return 0, err
	}
	var grace time.Duration
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "GracePeriod" || len(vs.Values) != 1 {
			return true
		}
		// GracePeriod = N * time.Second
		if be, ok := vs.Values[0].(*ast.BinaryExpr); ok && be.Op == token.MUL {
			lit, ok1 := be.X.(*ast.BasicLit)
			sel, ok2 := be.Y.(*ast.SelectorExpr)
			if ok1 && ok2 && lit.Kind == token.INT && sel.Sel.Name == "Second" {
				if n, err := strconv.Atoi(lit.Value); err == nil {
					grace = time.Duration(n) * time.Second
				}
			}
		}
		return false
	})
	if grace == 0 {
		return 0, fmt.Errorf("%s: no `GracePeriod = N * time.Second` found", path)
	}
	return grace + 5*time.Second, nil
}
