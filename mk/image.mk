# The trainer image built on this machine, for the dev cluster's real node (included by the top
# Makefile). make demo and make test build it (their CPU jobs run as pods of it): a cold build takes
# ~10 min and ~16 GB of disk, then it is cached by the hash of its inputs (scripts/trainer-image.sh).
.PHONY: trainer-image trainer-image-clean

## trainer-image: build the Dockerfile's trainer target with buildah (root) on a local Ubuntu 24.04 base,
## without EFA, into $(LLMTRAIN_CACHE)/buildah, and export it as an OCI archive under
## $(LLMTRAIN_CACHE)/trainer-image; prints the manifest file's path; a no-op when the inputs are unchanged
trainer-image:
	@bash scripts/trainer-image.sh

## trainer-image-clean: delete the builder's storage and the exported images (the next build is cold)
trainer-image-clean:
	@bash scripts/trainer-image.sh clean
