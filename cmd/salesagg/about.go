package main

import (
	"github.com/salesagg/salesagg/internal/config"
	"github.com/salesagg/salesagg/internal/httpapi"
)

// about is what the status page says of this service.
func about(cfg config.Config) httpapi.About {
	return httpapi.About{ApplicationID: cfg.ApplicationID, InputTopic: cfg.InputTopic,
		Brokers: cfg.BootstrapServers, Guarantee: cfg.ProcessingGuarantee, Version: readBuildInfo().short()}
}
