"""The Kubernetes controller: ModelServing -> pods and headless Services (docs/controller.md).
Imports the typed API and the apiserver helpers of kthena_router; never imported by it."""
