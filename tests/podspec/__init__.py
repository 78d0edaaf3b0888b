"""The shared package (podspec/): pods and nodes as gpufrac reads them."""
