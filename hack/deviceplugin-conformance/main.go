// deviceplugin-conformance runs kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, the code a real kubelet runs) in a directory
// of our choosing, so that the agent's device plugin can be driven by it end to end: the plugin
// registers with this manager's kubelet.sock, the manager connects back, watches the devices,
// asks for a preferred allocation, calls Allocate and turns the answer into the container's
// run options, exactly as kubelet does on a node.
//
// It is driven over stdin/stdout, one JSON object per line each way (stderr has kubelet's logs):
//
//	{"op":"start"}                          create the manager and serve <dir>/kubelet.sock
//	{"op":"restart"}                        stop it and start a new one (a kubelet restart)
//	{"op":"state","resource":"R"}           capacity and allocatable of R, and its devices
//	{"op":"admit","pod":{...}}              kubelet's pod admission: Allocate for every init and
//	                                        app container in order, then each container's
//	                                        run options (what the runtime would be handed)
//	{"op":"options","pod":{...}}            only the run options (after a restart: checkpointed)
//	{"op":"stop"}                           stop and exit
//
// Every answer has "ok"; a failure has "error" with kubelet's own message.
//
// kubelet's socket path is fixed (/var/lib/kubelet/device-plugins/kubelet.sock) in the exported
// constructor; the unexported one takes the path, and is reached with go:linkname so that the
// harness needs neither root nor a private mount namespace.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, store topologymanager.Store) (*devicemanager.ManagerImpl, error)

// noHints is the topology store of kubelet's default `none` topology-manager policy: no NUMA
// hint for any container, so the device manager asks the plugin for its preference among
// all available devices.
type noHints struct{}

func (noHints) GetAffinity(klog.Logger, string, string) topologymanager.TopologyHint {
	return topologymanager.TopologyHint{}
}
func (noHints) GetPolicy() topologymanager.Policy { return topologymanager.NewNonePolicy() }
func (noHints) Name() string                      { return "none" }

// allReady stands for kubelet's config sources: all seen, so the manager treats every
// Allocate as the steady-state flow (not a restart with containers already running).
type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

// kubelet's own logger (klog's flags on the command line decide its verbosity).
var logger = klog.Background()

// Set by hack/control-plane/build.sh; -version prints them (its cache check reads that).
var (
	kubernetesVersion = "unknown"
	sourceHash        = "unknown"
)

type harness struct {
	socket  string
	manager *devicemanager.ManagerImpl
	mu      sync.Mutex
	// The pods kubelet would call active: every pod admitted so far (none ends here).
	active map[string]*v1.Pod
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(h.active))
	for _, p := range h.active {
		pods = append(pods, p)
	}
	return pods
}

func (h *harness) start() error {
	m, err := newManagerImpl(logger, h.socket, nil, noHints{})
	if err != nil {
		return err
	}
	if err := m.Start(logger, h.activePods, allReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	h.manager = m
	return nil
}

func (h *harness) stop() error {
	if h.manager == nil {
		return nil
	}
	err := h.manager.Stop(logger)
	h.manager = nil
	return err
}

type device struct {
	ID     string  `json:"id"`
	Health string  `json:"health"`
	NUMA   []int64 `json:"numa"`
}

type mount struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

type runOptions struct {
	Container   string            `json:"container"`
	DeviceIDs   []string          `json:"device_ids"`
	Envs        map[string]string `json:"envs"`
	Mounts      []mount           `json:"mounts"`
	Devices     []string          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdi_devices"`
}

func (h *harness) state(resource string) map[string]any {
	capacity, allocatable, _ := h.manager.GetCapacity(logger)
	count := func(list v1.ResourceList) *int64 {
		q, ok := list[v1.ResourceName(resource)]
		if !ok {
			return nil
		}
		n := q.Value()
		return &n
	}
	// Healthy devices, as kubelet reports them to the pod-resources API.
	healthy := []device{}
	for id, d := range h.manager.GetAllocatableDevices(logger)[resource] {
		numa := []int64{}
		if d.Topology != nil {
			for _, n := range d.Topology.Nodes {
				numa = append(numa, n.ID)
			}
		}
		healthy = append(healthy, device{ID: id, Health: d.Health, NUMA: numa})
	}
	sort.Slice(healthy, func(i, j int) bool { return healthy[i].ID < healthy[j].ID })
	return map[string]any{"capacity": count(capacity), "allocatable": count(allocatable), "healthy_devices": healthy}
}

func (h *harness) options(pod *v1.Pod, c *v1.Container, resource string) (runOptions, error) {
	opts, err := h.manager.GetDeviceRunContainerOptions(context.Background(), pod, c)
	if err != nil {
		return runOptions{}, err
	}
	out := runOptions{Container: c.Name, DeviceIDs: []string{}, Envs: map[string]string{}, Mounts: []mount{},
		Devices: []string{}, Annotations: map[string]string{}, CDIDevices: []string{}}
	for id := range h.manager.GetDevices(string(pod.UID), c.Name)[resource] {
		out.DeviceIDs = append(out.DeviceIDs, id)
	}
	sort.Strings(out.DeviceIDs)
	if opts == nil { // nothing allocated to this container
		return out, nil
	}
	for _, e := range opts.Envs {
		out.Envs[e.Name] = e.Value
	}
	for _, m := range opts.Mounts {
		out.Mounts = append(out.Mounts, mount{m.ContainerPath, m.HostPath, m.ReadOnly})
	}
	for _, d := range opts.Devices {
		out.Devices = append(out.Devices, d.PathOnHost+":"+d.PathInContainer+":"+d.Permissions)
	}
	for _, a := range opts.Annotations {
		out.Annotations[a.Name] = a.Value
	}
	for _, d := range opts.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, d.Name)
	}
	return out, nil
}

func containers(pod *v1.Pod) []*v1.Container {
	var all []*v1.Container
	for i := range pod.Spec.InitContainers {
		all = append(all, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		all = append(all, &pod.Spec.Containers[i])
	}
	return all
}

// admit does what kubelet's admission does for device-plugin resources (the topology
// manager's container scope under the `none` policy): Allocate for each init container,
// then each app container, stopping at the first error; then, as at container start, the
// run options of every container.
func (h *harness) admit(pod *v1.Pod, resource string) (map[string]any, error) {
	h.mu.Lock()
	h.active[string(pod.UID)] = pod
	h.mu.Unlock()
	for _, c := range containers(pod) {
		if err := h.manager.Allocate(context.Background(), pod, c, lifecycle.AddOperation); err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
	}
	return h.allOptions(pod, resource)
}

func (h *harness) allOptions(pod *v1.Pod, resource string) (map[string]any, error) {
	all := []runOptions{}
	for _, c := range containers(pod) {
		o, err := h.options(pod, c, resource)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", c.Name, err)
		}
		all = append(all, o)
	}
	return map[string]any{"containers": all}, nil
}

type request struct {
	Op       string  `json:"op"`
	Resource string  `json:"resource"`
	Pod      *v1.Pod `json:"pod"`
}

func (h *harness) handle(req request) (map[string]any, error) {
	if req.Resource == "" {
		req.Resource = "nvidia.com/gpu"
	}
	if req.Op != "start" && h.manager == nil {
		return nil, errors.New("no manager: send start first")
	}
	switch req.Op {
	case "start":
		if h.manager != nil {
			return nil, errors.New("already started")
		}
		return map[string]any{"socket": h.socket}, h.start()
	case "restart":
		if err := h.stop(); err != nil {
			return nil, err
		}
		return map[string]any{"socket": h.socket}, h.start()
	case "state":
		return h.state(req.Resource), nil
	case "admit", "options":
		if req.Pod == nil {
			return nil, errors.New(req.Op + " needs a pod")
		}
		if req.Op == "admit" {
			return h.admit(req.Pod, req.Resource)
		}
		return h.allOptions(req.Pod, req.Resource)
	case "stop":
		return map[string]any{}, h.stop()
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

func main() {
	dir := flag.String("dir", "", "the device-plugin directory kubelet.sock is served in (created if missing)")
	version := flag.Bool("version", false, "print the Kubernetes version built against and the source hash")
	klog.InitFlags(nil)
	flag.Parse()
	if *version {
		fmt.Printf("deviceplugin-conformance kubelet %s source %s\n", kubernetesVersion, sourceHash)
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: deviceplugin-conformance -dir DIR [klog flags]")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	h := &harness{socket: filepath.Join(abs, "kubelet.sock"), active: map[string]*v1.Pod{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var reply map[string]any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			reply = map[string]any{"ok": false, "error": "bad request: " + err.Error()}
		} else if body, err := h.handle(req); err != nil {
			reply = map[string]any{"ok": false, "error": err.Error()}
		} else {
			body["ok"] = true
			reply = body
		}
		if err := out.Encode(reply); err != nil {
			os.Exit(1)
		}
		if req.Op == "stop" {
			return
		}
	}
	_ = h.stop()
}
