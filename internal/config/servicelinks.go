package config

import (
	"net"
	"regexp"
	"strings"
)

// Kubernetes sets, in every pod of a namespace (unless the pod spec says
// enableServiceLinks: false), these variables for each Service NAME (upper
// case, '-' as '_') with a cluster IP, as Docker links did:
//
//	NAME_SERVICE_HOST=10.0.0.11
//	NAME_SERVICE_PORT=8080
//	NAME_SERVICE_PORT_<PORTNAME>=8080          (each named port)
//	NAME_PORT=tcp://10.0.0.11:8080
//	NAME_PORT_8080_TCP=tcp://10.0.0.11:8080    (each port; TCP, UDP or SCTP)
//	NAME_PORT_8080_TCP_PROTO=tcp
//	NAME_PORT_8080_TCP_PORT=8080
//	NAME_PORT_8080_TCP_ADDR=10.0.0.11
//
// A Service named salesagg (or salesagg-anything) gives SALESAGG_ variables
// that are none of ours. Only these exact shapes, name and value, are
// ignored; any other unknown SALESAGG_ variable stays an error.
var (
	linkServiceHost = regexp.MustCompile(`^SALESAGG(_[A-Z0-9]+)*_SERVICE_HOST$`)
	linkServicePort = regexp.MustCompile(`^SALESAGG(_[A-Z0-9]+)*_SERVICE_PORT(_[A-Z0-9_]+)?$`)
	linkPort        = regexp.MustCompile(`^SALESAGG(_[A-Z0-9]+)*_PORT$`)
	linkPortProto   = regexp.MustCompile(`^SALESAGG(_[A-Z0-9]+)*_PORT_([0-9]+)_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?$`)
	linkURL         = regexp.MustCompile(`^(tcp|udp|sctp)://(.+)$`)
)

// serviceLink reports whether the variable name=val is one of the
// Kubernetes service-link shapes above.
func serviceLink(name, val string) bool {
	if m := linkPortProto.FindStringSubmatch(name); m != nil {
		port, proto, suffix := m[2], strings.ToLower(m[3]), m[4]
		switch suffix {
		case "_PROTO":
			return val == proto
		case "_PORT":
			return val == port
		case "_ADDR":
			return net.ParseIP(val) != nil
		default:
			return linkAddr(val, proto, port)
		}
	}
	switch {
	case linkServiceHost.MatchString(name):
		return net.ParseIP(val) != nil
	case linkServicePort.MatchString(name):
		return portIn(val, 1)
	case linkPort.MatchString(name):
		m := linkURL.FindStringSubmatch(val)
		if m == nil {
			return false
		}
		host, port, err := net.SplitHostPort(m[2])
		return err == nil && net.ParseIP(host) != nil && portIn(port, 1)
	}
	return false
}

// linkAddr reports whether val is proto://IP:port.
func linkAddr(val, proto, port string) bool {
	m := linkURL.FindStringSubmatch(val)
	if m == nil || m[1] != proto {
		return false
	}
	host, p, err := net.SplitHostPort(m[2])
	return err == nil && net.ParseIP(host) != nil && p == port
}
