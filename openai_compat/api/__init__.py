"""API families that grow beyond one router: each folder holds its wire types and routes."""
