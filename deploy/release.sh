#!/bin/sh
# Build both images and package the chart, at the chart's version, in one command:
#
#   deploy/release.sh REGISTRY        e.g. deploy/release.sh registry.example.com/gpufrac
#
# from the repository root. Tags REGISTRY/gpufrac:VERSION and REGISTRY/gpufrac-agent:VERSION
# (VERSION: `version` of deploy/helm/gpufrac/Chart.yaml, which the package, the app and the
# images share; CHANGELOG.md) with buildah, each image's packages at the versions of
# deploy/requirements/ (the lock), and writes dist/gpufrac-VERSION.tgz with helm. Pushing is
# yours (docs/install.md). BUILD_ARGS is added to both builds, e.g.
# BUILD_ARGS="--build-arg PYTHON_BASE=mirror.example.com/python:3.11-slim".
set -eu
registry=${1:?usage: deploy/release.sh REGISTRY (e.g. registry.example.com/gpufrac)}
version=$(sed -n 's/^version: *//p' deploy/helm/gpufrac/Chart.yaml)
for target in extender agent; do
  name=gpufrac; [ "$target" = agent ] && name=gpufrac-agent
  # shellcheck disable=SC2086 # BUILD_ARGS is a list of arguments
  buildah build -f deploy/Dockerfile --target "$target" --isolation chroot ${BUILD_ARGS:-} \
    -t "$registry/$name:$version" .
done
helm package deploy/helm/gpufrac --destination dist
echo "images: $registry/gpufrac:$version $registry/gpufrac-agent:$version; chart: dist/gpufrac-$version.tgz"
