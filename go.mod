module github.com/podnet/podnet

go 1.26.8

require (
	github.com/containernetworking/cni v1.3.1
	github.com/containernetworking/plugins v1.9.1
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.35.0
)

require (
	github.com/pkg/errors v0.9.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.opentelemetry.io/otel v1.29.0 // indirect
	go.opentelemetry.io/otel/trace v1.29.0 // indirect
)
