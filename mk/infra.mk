# Infrastructure checks and image builds (terraform/, Dockerfile). Included by the top Makefile;
# uses its VENV/PY. The pinned tools live in $(LLMTRAIN_CACHE): terraform-1.5.7/ (built from
# source with go) and checkov-<version>/ (own venv).
IMAGE_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_REPO ?= public.ecr.aws/llmtrain

.PHONY: infra-tools infra-test infra-fmt images

## infra-tools: build/install the pinned terraform (fmt/console) and checkov
infra-tools:
	@bash scripts/infra-terraform.sh >/dev/null
	@bash scripts/infra-checkov.sh >/dev/null

# Built before the suite starts, not inside its fixtures: a failed build stops `make test` with the
# tool's own message (and `make infra-tools` to retry) instead of erroring every test that uses it.
test: infra-tools

## infra-test: only the terraform/Dockerfile checks (they are part of `make test` too)
infra-test: $(VENV)/.installed infra-tools
	$(PY) -m pytest -m infra tests/infra $(PYTEST_ARGS)

## infra-fmt: rewrite terraform/ in canonical format with the pinned terraform
infra-fmt:
	"$$(bash scripts/infra-terraform.sh)" fmt -recursive terraform

## images: build both images (needs a container engine; not available on the CI machines)
images:
	docker build --target trainer -t $(IMAGE_REPO)/llmtrain-trainer:$(IMAGE_VERSION) .
	docker build --target operator -t $(IMAGE_REPO)/llmtrain-operator:$(IMAGE_VERSION) .
