// The lab CSI driver's registrar for one real node, as node-driver-registrar is for a real
// driver: it answers the kubelet's plugin watcher on the registration socket with the driver's
// name and the endpoint of its node plugin (served by the lab). It is Go because the kubelet
// dials this socket with its path as the HTTP/2 authority, which Rust's h2 server refuses.
// Built by scripts/build-node.sh.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registration.UnimplementedRegistrationServer
	driver, endpoint string
}

func (r registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r registrar) NotifyRegistrationStatus(_ context.Context, status *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if status.PluginRegistered {
		log.Printf("the kubelet registered %s", r.driver)
	} else {
		log.Printf("the kubelet refused %s: %s", r.driver, status.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

func main() {
	socket := flag.String("socket", "", "the registration socket to listen on (in the kubelet's plugins_registry)")
	driver := flag.String("driver", "", "the CSI driver's name")
	endpoint := flag.String("endpoint", "", "the node plugin's socket, as the kubelet sees it")
	flag.Parse()
	if *socket == "" || *driver == "" || *endpoint == "" {
		log.Fatal("csi-registrar: --socket, --driver and --endpoint are required")
	}
	// The kubelet makes its plugins_registry at its first start; the registrar may be first.
	if err := os.MkdirAll(filepath.Dir(*socket), 0o750); err != nil {
		log.Fatal(err)
	}
	// A socket file of an earlier run (the node's disk keeps it).
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	registration.RegisterRegistrationServer(server, registrar{driver: *driver, endpoint: *endpoint})
	log.Fatal(server.Serve(listener))
}
