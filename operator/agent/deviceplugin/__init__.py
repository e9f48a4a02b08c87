"""The agent's kubelet device-plugin side (issue 13): ``allocation`` is the pure core that
turns a pod's allocation annotation into what each container receives."""
