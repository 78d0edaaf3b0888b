"""kubelet device plugin (API v1beta1) advertising ``gpufrac.io/gpu`` and applying gpufrac's choice."""
