package main

import (
	"runtime/debug"

	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
)

// about is what the status page says of this service.
func about(cfg config.Config) httpapi.About {
	return httpapi.About{ApplicationID: cfg.ApplicationID, InputTopic: cfg.InputTopic,
		Brokers: cfg.BootstrapServers, Guarantee: cfg.ProcessingGuarantee, Version: buildVersion()}
}

// buildVersion is the module version and the VCS commit the binary was
// built from, as the build info records them ("" when it has none).
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v
}
